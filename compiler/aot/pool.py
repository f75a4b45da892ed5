"""The compile workers: fresh Python processes that compile kernels in parallel, one pool
per process, started early (`start`), reused across graphs, sized to the cores
(`KILN_COMPILE_WORKERS`; 0 compiles on the building thread).

The workers are started with `python -c` (`_start_process`; not forked: CUDA may be
initialised here; not multiprocessing's spawn, which re-runs the user's `__main__` script in
each) and run `compiler.aot.worker.serve`, exchanging JSON lines with this process. A
compile that kills its worker is retried alone in a fresh one (the other workers go on);
a job that kills a worker again is reported CRASHED.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict

from compiler.aot.jobs import CompileJob
from compiler.aot.worker import compile_job, one_line

log = logging.getLogger(__name__)

WORKERS_ENV = "KILN_COMPILE_WORKERS"
MAX_WORKERS = 32  # past this, workers cost memory and start-up for kernels few graphs have
CRASHED = "crashed"  # compile_all's verdict for a job whose compile killed its worker twice


def workers() -> int:
    """Worker processes for compiling: $KILN_COMPILE_WORKERS, else the usable cores (at
    most MAX_WORKERS). 0 means none: kernels compile on the building thread."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be a whole number, got {raw!r}") from None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, cores or 1))


# A worker is `python -c _BOOT <sys.path as JSON> <result fd>`: it runs `serve`, nothing of
# the building process's `__main__` (multiprocessing's spawn re-runs the user's script in
# every worker: its imports, torch's among them, and all of it when the script has no
# `if __name__ == "__main__"` guard).
_BOOT = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
         "from compiler.aot.worker import serve; serve(int(sys.argv[2]))")


def _start_process(answers_fd: int) -> subprocess.Popen[bytes]:
    """Start one worker process: requests go to its stdin, it writes answers to
    `answers_fd` (passed to it). Without TRITON_INTERPRET: under the interpreter, Triton's
    own @jit helpers (tl.max, tl.sum) are interpreted functions and nothing lowers for a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), str(answers_fd)],
                            stdin=subprocess.PIPE, pass_fds=(answers_fd,), env=env)


class _Worker:
    """One compile worker process and the two pipes to it."""

    def __init__(self) -> None:
        read, write = os.pipe()
        try:
            self.process = _start_process(write)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self._answers = os.fdopen(read, "r")

    def ask(self, run: str, job: CompileJob) -> str | None | bool:
        """`run(job)` in the worker: its answer, or False when the worker died doing it."""
        assert self.process.stdin is not None
        request = json.dumps({"run": run, "job": asdict(job)}) + "\n"
        try:
            self.process.stdin.write(request.encode())
            self.process.stdin.flush()
            line = self._answers.readline()
        except (BrokenPipeError, OSError, ValueError):
            line = ""
        if not line:
            self.close()
            return False
        return json.loads(line)["result"]

    def close(self, timeout: float = 5.0) -> None:
        """Close its stdin (its loop ends) and wait; kill it if it does not end."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._answers.close()


class CompilePool:
    """Compile worker processes (`worker.serve`) that outlive a compile that kills one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[_Worker] = []
        self._count = 0  # workers alive: idle or busy
        self._closed = False
        self._cond = threading.Condition()

    def start(self) -> None:
        """Start every worker now; each imports Triton and warms up (returns at once)."""
        with self._cond:
            self._closed = False
            while self._count < self.size:
                self._idle.append(_Worker())
                self._count += 1

    def _take(self) -> _Worker:
        with self._cond:
            while not self._idle and self._count >= self.size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker()
        except BaseException:
            self._lost()
            raise

    def _give(self, worker: _Worker) -> None:
        with self._cond:
            if self._closed:
                self._count -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()
        if self._closed:
            worker.close()

    def _lost(self) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def _run_one(self, run: str, job: CompileJob) -> str | None | bool:
        worker = self._take()
        answer = worker.ask(run, job)
        if answer is False:
            self._lost()
        else:
            self._give(worker)
        return answer

    def _ask(self, run: str, job: CompileJob) -> str | None | bool:
        """`_run_one`, with a worker that cannot be started reported as the job's error."""
        try:
            return self._run_one(run, job)
        except Exception as exc:  # noqa: BLE001 - no worker: compiled here instead
            return f"no compile worker: {one_line(exc)}"

    def compile_all(self, jobs: list[CompileJob],
                    run: Callable[[CompileJob], str | None] = compile_job) -> list[str | None]:
        """Compile `jobs` in parallel: per job None, an error, or CRASHED (its compile
        killed its worker, and then a fresh worker that had only it to do)."""
        name = f"{run.__module__}:{run.__qualname__}"
        with self._cond:
            self._closed = False
        results: list[str | None | bool] = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        lock = threading.Lock()

        def drive() -> None:
            while True:
                with lock:
                    if not pending:
                        return
                    i = pending.pop()
                results[i] = self._ask(name, jobs[i])

        threads = [threading.Thread(target=drive, name="kiln-compile", daemon=True)
                   for _ in range(min(self.size, len(jobs)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        retry = [i for i, r in enumerate(results) if r is False]
        if retry:
            log.warning("a kernel compile killed its worker; retrying %d kernels one at a time",
                        len(retry))
        for i in retry:  # alone in a fresh worker, so that a crash names its kernel
            answer = self._ask(name, jobs[i])
            results[i] = CRASHED if answer is False else answer
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the workers (busy ones when their job is done)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.close()


_shared: CompilePool | None = None
_shared_lock = threading.Lock()


def shared() -> CompilePool | None:
    """The process's compile pool (None when $KILN_COMPILE_WORKERS is 0)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            size = workers()
            if size == 0:
                return None
            _shared = CompilePool(size)
        return _shared


def start() -> None:
    """Start the compile workers now, so that they are ready by the first precompile
    (the client calls this when a model is first compiled). No-op under the interpreter."""
    from triton import knobs

    pool = None if knobs.runtime.interpret else shared()
    if pool is not None:
        pool.start()


def _forget_after_fork() -> None:
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()  # the workers belong to the parent


os.register_at_fork(after_in_child=_forget_after_fork)
