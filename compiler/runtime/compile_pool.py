"""Compile a built graph's Triton kernels in a pool of worker processes; load them here.

`Built.precompile` prepares every kernel before the first call. Compiling them one after
another on the building thread is most of a big model's first step, so instead:
1. on the building thread, Triton's JIT is asked, for each distinct launch, what it would
   compile: the exact specialisation (signature, constants, alignment attributes, options,
   target) that `knobs.runtime.jit_cache_hook` receives as Triton's own
   `specialization_data`, without compiling anything;
2. the workers compile those in parallel with `triton.compile`, which stores each binary in
   Triton's on-disk cache under the key the JIT computes for that launch;
3. back on the building thread, `warmup` finds each binary in the cache and loads it.

The workers are spawned (CUDA may be initialised here), import Triton with the interpreter
off and neither torch nor CUDA, and serve the whole process: one pool, started early
(`start`), reused across graphs, sized to the cores (`KILN_COMPILE_WORKERS`; 0 compiles on
the building thread). Nothing here is needed for correctness: when Triton does not report
a specialisation, or a worker cannot compile a kernel, the building thread compiles it.
A compile that kills its worker breaks the pool; a new one retries the unfinished jobs one
at a time, and a kernel that kills a worker again fails its build here (never compiled in
this process, which it would kill too).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from compiler.runtime.kernel_files import import_kernel

log = logging.getLogger(__name__)

WORKERS_ENV = "KILN_COMPILE_WORKERS"
MAX_WORKERS = 32  # past this, workers cost memory and start-up for kernels few graphs have
CRASHED = "crashed"  # compile_all's verdict for a job whose compile killed its worker twice


class CompileCrash(RuntimeError):
    """Compiling a kernel killed the compile worker, twice."""


@dataclass(frozen=True)
class CompileJob:
    """One kernel to compile: its generated source and Triton's specialisation of a launch."""

    kernel: str  # the schedule's name for it, for messages
    source: str
    source_hash: str
    fn_name: str
    spec: str  # Triton's specialization data (JSON text)


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


# ---- in the workers ------------------------------------------------------------------------
_modules: dict[str, Any] = {}


def _init_worker() -> None:
    # Before Triton is imported here: under the interpreter, Triton's own @jit helpers
    # (tl.max, tl.sum) are interpreted functions and nothing lowers for a GPU.
    os.environ.pop("TRITON_INTERPRET", None)


def _warm() -> int:
    import triton.compiler  # noqa: F401 - pay the import before the first job

    return os.getpid()


def compile_job(job: CompileJob) -> str | None:
    """Compile one job into Triton's cache: None, or why it did not compile (one line)."""
    try:
        _compile(job)
    except Exception as exc:  # Triton's errors span many types; the caller compiles again
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
    return None


def _compile(job: CompileJob) -> Any:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = _modules.get(job.source_hash)
    if module is None:
        module = _modules[job.source_hash] = import_kernel(job.source, job.source_hash)
    fn = getattr(module, job.fn_name)
    data = json.loads(job.spec)

    def listed(value: Any) -> Any:  # JSON made tuples lists (Triton's preload does the same)
        return tuple(value) if isinstance(value, list) else value

    def constant(value: Any) -> Any:
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(listed(value["constexpr"]))
        if isinstance(value, dict):
            raise ValueError(f"constant {value} is not a value kiln passes")
        if isinstance(value, str) and tl.dtype.is_dtype(value):
            return tl.dtype(value)
        return listed(value)

    constexprs = {tuple(k): constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"],
                                                        strict=True)}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    signature = {k: listed(v) for k, v in data["signature"].items()}
    options = {k: listed(v) for k, v in data["options"].items()}
    return triton.compile(ASTSource(fn, signature, constexprs, attrs),
                          target=GPUTarget(**data["target"]), options=options)


# ---- in the building process ---------------------------------------------------------------
class CompilePool:
    """A pool of spawned compile workers that outlives a broken worker."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Spawn every worker now and have it import Triton (returns at once)."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.size, mp_context=mp.get_context("spawn"),
                                                 initializer=_init_worker)
                for _ in range(self.size):
                    self._pool.submit(_warm)

    def _executor(self) -> ProcessPoolExecutor:
        self.start()
        assert self._pool is not None
        return self._pool

    def _restart(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    def compile_all(self, jobs: list[CompileJob],
                    run: Callable[[CompileJob], str | None] = compile_job) -> list[str | None]:
        """Compile `jobs` in parallel: per job None, an error, or CRASHED."""
        pool = self._executor()
        futures = [pool.submit(run, job) for job in jobs]
        results: list[str | None] = [None] * len(jobs)
        retry = []
        for i, future in enumerate(futures):
            try:
                results[i] = future.result()
            except BrokenProcessPool:
                retry.append(i)
        if retry:
            log.warning("a kernel compile killed its worker; retrying %d kernels one at a time",
                        len(retry))
            self._restart(pool)
        for i in retry:  # one at a time, so that a crash names its kernel
            pool = self._executor()
            try:
                results[i] = pool.submit(run, jobs[i]).result()
            except BrokenProcessPool:
                self._restart(pool)
                results[i] = CRASHED
        return results

    def close(self) -> None:
        """Stop the workers."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


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
    from compiler.runtime.execution import runs_on_cpu

    pool = None if runs_on_cpu() else shared()
    if pool is not None:
        pool.start()


def _forget_after_fork() -> None:
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()  # the workers belong to the parent


os.register_at_fork(after_in_child=_forget_after_fork)


_hook_lock = threading.Lock()
_capturing = threading.local()


def specialization(fn: Any, args: tuple, grid: tuple[int, ...], kwargs: dict[str, Any]) -> str | None:
    """What Triton's JIT would compile for `fn.warmup(*args, grid=grid, **kwargs)` on the
    current device, as its specialization data (JSON), without compiling; None when the
    kernel is already loaded or this Triton does not report it."""
    try:
        from triton import knobs
    except ImportError:
        return None
    captured: list[str] = []
    with _hook_lock:
        previous = knobs.runtime.jit_cache_hook

        def hook(**kw: Any) -> Any:
            if getattr(_capturing, "on", False):  # other threads' compiles pass through
                captured.append(kw.get("compile", {}).get("specialization_data"))
                return True  # "handled": the JIT returns without compiling
            return previous(**kw) if previous is not None else None

        knobs.runtime.jit_cache_hook = hook
        _capturing.on = True
        try:
            fn.warmup(*args, grid=grid, **kwargs)
        finally:
            _capturing.on = False
            knobs.runtime.jit_cache_hook = previous
    return captured[0] if captured and isinstance(captured[0], str) else None


def compile_ahead(jobs: list[CompileJob]) -> int:
    """Compile `jobs` in the shared pool, so that loading them afterwards hits Triton's
    cache; how many compiled there. Raises CompileCrash naming a kernel that kills the
    compiler; other failures are left for the building thread to compile (and report)."""
    pool = shared()
    if pool is None or len(jobs) < 2:  # one kernel compiles as fast here
        return 0
    results = pool.compile_all(jobs)
    for job, result in zip(jobs, results, strict=True):
        if result == CRASHED:
            raise CompileCrash(f"kernel {job.kernel} killed the Triton compiler (in a compile "
                               f"worker, twice); the graph cannot be built")
        if result is not None:
            log.debug("compile worker: kernel %s: %s", job.kernel, result)
    return sum(r is None for r in results)
