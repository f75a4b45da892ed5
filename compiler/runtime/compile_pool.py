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
Jobs whose binary Triton's cache holds already are not compiled, and a thread may name a
binary source (`binary_source`; the client's is the kiln service, `kiln/binaries.py`) that
is asked first for the missing ones by their Triton cache key (`cache_key`, carried in each
job's specialisation data) and writes those it has into Triton's cache (`install_binary`).

The same compile (`compile_spec`) serves the service's target compile and the tuner's
compile workers (`tuner/aot.py`), which have no GPU: Triton's JIT, run against a stand-in
driver for the target (`standin_specialization`), gives them the specialisation a client's
JIT computes, so their binaries are the ones clients look up.

The workers are fresh Python processes (`python -c`, not forked: CUDA may be initialised
here; not multiprocessing's spawn, which re-runs the user's `__main__` script in each),
exchanging JSON lines with this process (`_serve`); they import Triton with the
interpreter off and neither torch nor CUDA, warm up (Triton's own cache key) before their
first job, and serve the whole process: one pool, started early (`start`), reused across
graphs, sized to the cores (`KILN_COMPILE_WORKERS`; 0 compiles on the building thread).
Nothing here is needed for correctness: when Triton does not report a specialisation, or a
worker cannot compile a kernel, the building thread compiles it. A compile that kills its
worker is retried alone in a fresh one (the other workers go on), and a kernel that kills
a worker again fails its build here (never compiled in this process, which it would kill
too).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

from compiler.runtime import triton_key
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
    launcher: bool = True  # also build its launcher (`build_launcher`) where Triton has one each


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


def _warm() -> int:
    """Pay, before the first job, what a worker's first compile costs once: Triton's import
    and its own cache key (a hash of its sources and its ~500 MB library, which every
    compile's cache key includes)."""
    import triton.compiler  # noqa: F401
    from triton.runtime.cache import triton_key

    triton_key()
    return os.getpid()


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]


def compile_job(job: CompileJob) -> str | None:
    """Compile one job into Triton's cache, and on a Triton that builds a C launcher per
    kernel signature, its launcher too (`build_launcher`; for a job whose binary is cached
    already, only that): None, or why it did not (one line)."""
    try:
        kernel = _compile(job)
    except Exception as exc:  # Triton's errors span many types; the caller compiles again
        return _one_line(exc)
    if job.launcher:
        try:
            build_launcher(kernel)
        except Exception as exc:  # noqa: BLE001 - the building thread builds it then
            return f"launcher: {_one_line(exc)}"
    return None


def per_kernel_launchers() -> bool:
    """Whether this Triton builds a C launcher per kernel signature (its NVIDIA driver's
    `make_launcher`, compiled with the system's C compiler into Triton's cache) when it
    loads a CUDA kernel: Triton 3.6 does, on the loading thread, one compiler run per
    signature its cache lacks; Triton 3.9 launches every kernel through one launcher."""
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return False
    return callable(getattr(nvidia, "make_launcher", None))


def build_launcher(kernel: Any) -> None:
    """Build the C launcher of a compiled kernel (a `triton.compile` result) into Triton's
    cache where this Triton builds one per signature (`per_kernel_launchers`), with the
    call its loading thread makes (`CompiledKernel._init_handles`:
    `launcher_cls(src, metadata)`), so that the load finds it there; nothing otherwise."""
    target = getattr(getattr(kernel, "metadata", None), "target", None)
    if getattr(target, "backend", None) != "cuda" or not per_kernel_launchers():
        return
    from triton.backends.nvidia.driver import CudaLauncher

    CudaLauncher(kernel.src, kernel.metadata)


def launcher_signature(job: CompileJob) -> str | None:
    """What a job's launcher source depends on (Triton 3.6's `make_launcher`: the kernel's
    signature), as text; None when its specialisation data does not say."""
    signature = _spec_field(job, "signature")
    return json.dumps(signature, sort_keys=True) if isinstance(signature, dict) else None


def _spec_field(job: CompileJob, name: str) -> Any:
    """Field `name` of a job's specialisation data; None when the data is no JSON object."""
    try:
        return json.loads(job.spec).get(name)
    except (ValueError, AttributeError):
        return None


def _compile(job: CompileJob) -> Any:
    module = _modules.get(job.source_hash)
    if module is None:
        module = _modules[job.source_hash] = import_kernel(job.source, job.source_hash)
    return compile_spec(getattr(module, job.fn_name), job.spec)


def _decode(fn: Any, spec: str) -> tuple[Any, Any, dict[str, Any]]:
    """Triton's ASTSource, GPUTarget and options for a specialization (JSON text), as the
    JIT builds them for that launch: constants, attributes and options back from JSON."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    data = json.loads(spec)

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
    return ASTSource(fn, signature, constexprs, attrs), GPUTarget(**data["target"]), options


def compile_spec(fn: Any, spec: str) -> Any:
    """`triton.compile` of the JIT function `fn` as specialised by `spec` (a launch's
    specialization data, `specialization` or `standin_specialization`): the binary lands in
    Triton's cache under the key the JIT looks up for that launch, `cache_key(fn, spec)`.
    The one ahead-of-time compile of the client's workers, the service and the tuner."""
    import triton

    src, target, options = _decode(fn, spec)
    return triton.compile(src, target=target, options=options)


def cache_key(fn: Any, spec: str) -> str | None:
    """The key under which `triton.compile` keeps (and finds) the binary of `fn` as
    specialised by `spec` in Triton's cache: sha256 of Triton's version and sources, the
    kernel's source and specialisation, the backend (ptxas version, arch), the options and
    the cache-invalidating environment. What `compile_spec` computes before compiling, so a
    binary compiled elsewhere under this key is the one this process's JIT would load. None
    where this Triton adds something kiln cannot see (a stages-inspection hook)."""
    from triton import knobs
    from triton.compiler.compiler import get_cache_invalidating_env_vars, make_backend
    from triton.runtime.cache import get_cache_key

    if getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None:
        return None
    src, target, options = _decode(fn, spec)
    backend = make_backend(target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


# ---- in the building process ---------------------------------------------------------------
# A worker is `python -c _BOOT <sys.path as JSON> <result fd>`: it runs `_serve`, nothing of
# the building process's `__main__` (multiprocessing's spawn re-runs the user's script in
# every worker: its imports, torch's among them, and all of it when the script has no
# `if __name__ == "__main__"` guard).
_BOOT = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
         "from compiler.runtime.compile_pool import _serve; _serve(int(sys.argv[2]))")


def _serve(fd: int) -> None:
    """A compile worker's loop: one JSON request a line on stdin (`run`: "module:function"
    taking a CompileJob, `job`: its fields), one JSON answer a line on `fd` (`result`);
    returns when stdin closes. The worker's own stdout goes to stderr, so that nothing a
    compiler prints can interleave with the answers."""
    import importlib

    answers = os.fdopen(fd, "w")
    os.dup2(2, 1)
    try:
        _warm()
    except Exception as exc:  # noqa: BLE001 - each job then reports what is wrong
        log.debug("compile worker: warming up failed: %s", exc)
    runners: dict[str, Callable[[CompileJob], str | None]] = {}
    for line in sys.stdin:
        request = json.loads(line)
        name = request["run"]
        if name not in runners:
            module, _, function = name.partition(":")
            runners[name] = getattr(importlib.import_module(module), function)
        try:
            result = runners[name](CompileJob(**request["job"]))
        except Exception as exc:  # noqa: BLE001 - the building thread compiles it then
            result = _one_line(exc)
        answers.write(json.dumps({"result": result}) + "\n")
        answers.flush()


class _Worker:
    """One compile worker process and the two pipes to it."""

    def __init__(self) -> None:
        read, write = os.pipe()
        # Without TRITON_INTERPRET: under the interpreter, Triton's own @jit helpers (tl.max,
        # tl.sum) are interpreted functions and nothing lowers for a GPU.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(write)],
                stdin=subprocess.PIPE, pass_fds=(write,), env=env)
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
    """Compile worker processes (`_serve`) that outlive a compile that kills one."""

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
            return f"no compile worker: {_one_line(exc)}"

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
    from compiler.runtime.execution import runs_on_cpu

    pool = None if runs_on_cpu() else shared()
    if pool is not None:
        pool.start()


def prepare_loading() -> None:
    """Pay, ahead of the first precompile, what loading this process's first kernel costs
    once: Triton's cache key of itself (`triton_key.ensure`), its backend's part of every
    kernel's key (`backend_hash`) and its CUDA driver (which builds a
    utility module with the C compiler when Triton's cache lacks it, unless it is
    `static_launch.lazy_driver`'s, which defers that to a use that kernels launched through
    torch's static launcher never make). The client runs this on a thread of its own while
    the first graph is traced; raises what Triton raises without a CUDA device."""
    from triton.runtime.driver import driver

    from compiler.runtime import static_launch

    triton_key.ensure()
    static_launch.lazy_driver()  # before the line below makes Triton's driver
    backend_hash(driver.active.get_current_target())


def backend_hash(target: Any) -> None:
    """Pay what the first cache key of a kernel for `target` asks of Triton's backend once
    (the NVIDIA one runs `ptxas --version` twice, 20-40 ms of waiting, and hashes libdevice;
    each cached for the process), so that the first specialisation does not wait for it."""
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    backend.hash()
    backend.parse_options({}).hash()


def _forget_after_fork() -> None:
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()  # the workers belong to the parent


os.register_at_fork(after_in_child=_forget_after_fork)


_hook_lock = threading.RLock()  # a stand-in driver's capture holds it around its own
_capturing = threading.local()


def specialization(fn: Any, args: tuple, grid: tuple[int, ...], kwargs: dict[str, Any]) -> str | None:
    """What Triton's JIT would compile for `fn.warmup(*args, grid=grid, **kwargs)` on the
    current device, as its specialization data (JSON), without compiling; None when the
    kernel is already loaded or this Triton does not report it. The data always names the
    target (Triton 3.6 leaves it out) and carries `cache_key`: Triton's cache key for the
    binary (`cache_key`), what the service's binaries are looked up by."""
    try:
        from triton import knobs
        from triton.runtime.driver import driver
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
    if not captured or not isinstance(captured[0], str):
        return None
    data = json.loads(captured[0])
    if "target" not in data:
        data["target"] = dict(vars(driver.active.get_current_target()))
    spec = json.dumps(data)
    try:
        triton_key.ensure()  # waits for the child's (or another thread's) key
        data["cache_key"] = cache_key(fn, spec)
    except Exception as exc:  # noqa: BLE001 - no key only means no binary from the service
        log.debug("no Triton cache key for %s: %s", getattr(fn, "__name__", fn), exc)
        data["cache_key"] = None
    return json.dumps(data)


class StandInDriver:
    """What the JIT asks a CUDA driver before it compiles (device, stream, target), for a
    GPU that is not here: with it, `fn.warmup` specialises a launch exactly as on that GPU."""

    def __init__(self, arch: int) -> None:
        self.arch = arch

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.arch, 32)


def standin_specialization(fn: Any, arg_dtypes: tuple, constexprs: dict[str, Any],
                           options: dict[str, Any], arch: int) -> str | None:
    """`specialization` of a launch on 16-byte aligned buffers (what `Built.precompile`
    asks the client's JIT for) for a CUDA GPU of compute capability `arch` (90 for sm_90)
    that this process does not have: the JIT runs against a stand-in driver for the call.
    `fn` must be a JIT function of its own (`tuner.aot` re-imports one per kernel): the JIT
    keeps the stand-in's target in the function's per-device state. Only for processes that
    launch nothing on a GPU while it runs (compile workers, the service's compile process)."""
    from triton.runtime.driver import driver

    with _hook_lock:  # one driver for the process: no other capture in between
        saved = getattr(driver, "_active", None)
        driver.set_active(StandInDriver(arch))
        try:
            return specialization(fn, tuple(arg_dtypes), (1,), {**constexprs, **options})
        finally:
            driver._active = saved


# ---- compiled binaries in Triton's cache -------------------------------------------------
# A binary's files as Triton's cache keeps them: `<kernel>.json` (metadata) and
# `<kernel>.cubin`; the intermediate forms (ttir, ptx, ...) are not needed to load it.
BINARY_SUFFIXES = (".json", ".cubin")
_FILE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,150}\.(json|cubin)")


def binary_files(compiled: Any) -> dict[str, bytes]:
    """The files of a `triton.compile` result that loading it needs, by name, read from
    Triton's cache (metadata and cubin)."""
    files = {}
    for name, path in compiled.metadata_group.items():
        if name.endswith(BINARY_SUFFIXES) and not name.startswith("__grp__"):
            with open(path, "rb") as f:
                files[name] = f.read()
    return files


def check_binary_files(key: str, files: dict[str, bytes]) -> str | None:
    """Why `files` are not one kernel binary that `install_binary` may write under `key`
    (names, the metadata's own hash and name, the cubin beside it), or None."""
    names = sorted(files)
    if len(names) != 2 or not all(_FILE_NAME.fullmatch(n) for n in names):
        return f"unexpected files {names[:4]}"
    meta_name = next((n for n in names if n.endswith(".json")), None)
    if meta_name is None or f"{meta_name[:-5]}.cubin" not in files:
        return f"unexpected files {names}"
    try:
        meta = json.loads(files[meta_name])
    except ValueError as exc:
        return f"metadata is not JSON ({exc})"
    if not isinstance(meta, dict) or meta.get("hash") != key:
        return "its metadata names another cache key"
    if not isinstance(meta.get("name"), str) or meta["name"][:150] != meta_name[:-5]:
        return "its metadata names another kernel"
    return None


# Whether Triton's own cache manager found the first binary written at once where
# `_file_cache_dir` said (None: not written yet in this process; False: it did not, and
# binaries go through the manager from then on).
_layout_confirmed: bool | None = None


def _file_cache_dir(key: str) -> str | None:
    """The directory Triton's own file cache keeps `key` in (its cache directory, then the
    key in base32, as `get_cache_manager` names it), without making it as a cache manager
    does; None where another cache manager is configured or this Triton names it otherwise
    (imports, or the first binary's check in `install_binary`)."""
    if _layout_confirmed is False:
        return None
    try:
        from triton import knobs
        from triton.runtime.cache import _base32
    except ImportError:
        return None
    if knobs.cache.manager_class is not None or not knobs.cache.dir:
        return None
    return os.path.join(knobs.cache.dir, _base32(key))


def is_cached(key: str, fn_name: str) -> bool:
    """Whether Triton's cache holds a loadable binary under `key` for kernel `fn_name`
    (where Triton's own file cache has no directory for the key, without making one)."""
    from triton.runtime.cache import get_cache_manager

    directory = _file_cache_dir(key)
    if directory is not None and not os.path.isdir(directory):
        return False
    metadata = f"{fn_name[:150]}.json"
    group = get_cache_manager(key).get_group(metadata)
    return bool(group) and metadata in group


def install_binary(key: str, files: dict[str, bytes]) -> None:
    """Write a binary's files (checked by `check_binary_files`; raises ValueError
    otherwise) into Triton's cache under `key`, with the group record that makes the JIT
    find them: its next launch with that specialisation loads them without compiling.
    Into Triton's own file cache, where the key has no directory or an empty one, they go
    at once (`_install_at_once`; the process's first such binary is looked up through
    Triton's own manager, and should it not be found there, that one and all later ones go
    through the manager); otherwise through the cache manager, file by file."""
    global _layout_confirmed
    from triton.runtime.cache import get_cache_manager

    why = check_binary_files(key, files)
    if why is not None:
        raise ValueError(why)
    metadata = next(n for n in files if n.endswith(".json"))
    directory = _file_cache_dir(key)
    if directory is not None:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        if _install_at_once(directory, files, metadata):
            if _layout_confirmed:
                return
            _layout_confirmed = bool(get_cache_manager(key).get_group(metadata))
            if _layout_confirmed:
                return
            log.warning("kiln: Triton's cache did not find a binary where kiln wrote it; "
                        "writing binaries through Triton's cache manager")
            shutil.rmtree(directory, ignore_errors=True)
    manager = get_cache_manager(key)
    group = {name: manager.put(data, name, binary=True) for name, data in sorted(files.items())}
    manager.put_group(metadata, group)


def _install_at_once(directory: str, files: dict[str, bytes], metadata: str) -> bool:
    """Write a binary's files and group record as Triton's file cache lays them out into a
    fresh directory beside `directory`, then rename it to `directory`, which must be
    absent or empty: one rename where the manager's `put` makes, renames into place and removes a
    temporary directory per file (37 file system calls a binary: on an H200 host's disk,
    most of installing a graph's binaries). False, having changed nothing, when `directory`
    holds anything (another process's files) or a write fails. `metadata`: the name of the
    binary's metadata file, which names its group record."""
    group = {name: os.path.join(directory, name) for name in sorted(files)}
    contents = {**files, f"__grp__{metadata}": json.dumps({"child_paths": group}).encode()}
    staging = f"{directory}.tmp.pid_{os.getpid()}_{os.urandom(8).hex()}"
    try:
        os.mkdir(staging)
        for name, data in sorted(contents.items()):
            fd = os.open(os.path.join(staging, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        os.rename(staging, directory)  # also over an empty directory; never over a full one
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True


def remove_binary(key: str) -> None:
    """Delete what Triton's cache holds under `key` (a binary that did not load)."""
    from triton.runtime.cache import get_cache_manager

    directory = getattr(get_cache_manager(key), "cache_dir", None)
    if directory and os.path.isdir(directory):
        shutil.rmtree(directory, ignore_errors=True)


def forget_binaries(keys: list[str], fns: list[Any]) -> None:
    """Take back binaries installed under `keys`: delete them from Triton's cache, and drop
    the kernels the JIT functions `fns` made of them, so that the next warmup compiles."""
    gone = set(keys)
    for key in gone:
        remove_binary(key)
    for fn in fns:
        for caches in list(getattr(fn, "device_caches", {}).values()):
            kernels = caches[0] if isinstance(caches, tuple) and caches else None
            if isinstance(kernels, dict):
                for k in [k for k, v in kernels.items() if getattr(v, "hash", None) in gone]:
                    del kernels[k]


# A function that takes compile jobs whose binaries are not in Triton's cache, writes those
# it can get (`install_binary`) and returns the cache keys it wrote; set per thread.
BinarySource = Callable[[list[CompileJob]], set[str]]
_sources = threading.local()


def job_key(job: CompileJob) -> str | None:
    """The Triton cache key `specialization` put in a job's data, or None."""
    key = _spec_field(job, "cache_key")
    return key if isinstance(key, str) else None


@contextmanager
def binary_source(source: BinarySource | None) -> Iterator[list[str]]:
    """While the block runs on this thread, `compile_ahead` asks `source` for the binaries
    of the jobs Triton's cache lacks before compiling any; the list given to the block
    collects the keys it installed (to take them back should one not load)."""
    placed: list[str] = []
    saved = getattr(_sources, "current", None)
    _sources.current = (source, placed) if source is not None else None
    try:
        yield placed
    finally:
        _sources.current = saved


def _not_cached(jobs: list[CompileJob]) -> list[CompileJob]:
    """The jobs whose binaries are neither in Triton's cache nor obtained from this
    thread's binary source (which writes them there)."""
    keyed = [(job, job_key(job)) for job in jobs]
    todo = [(job, key) for job, key in keyed if key is None or not is_cached(key, job.fn_name)]
    current = getattr(_sources, "current", None)
    asked = [job for job, key in todo if key is not None]
    if current is None or not asked:
        return [job for job, _ in todo]
    source, placed = current
    try:
        got = source(asked)
    except Exception as exc:  # noqa: BLE001 - binaries are an optimisation: compile instead
        log.warning("kiln: fetching compiled kernels failed (%s: %s); compiling them here",
                    type(exc).__name__, exc)
        got = set()
    placed.extend(sorted(got))
    return [job for job, key in todo if key not in got]


def _with_launchers(jobs: list[CompileJob], todo: list[CompileJob]) -> list[tuple[CompileJob, bool]]:
    """What to send to the workers where Triton builds a launcher per signature: each job
    to compile, and for each signature none of those has, one job whose binary is cached
    (its compile finds it there), so that every launcher is built in parallel too; one job
    per signature builds its launcher. Pairs (job, whether it compiles a binary)."""
    compiling = set(todo)
    send: list[tuple[CompileJob, bool]] = []
    seen: set[str] = set()
    for job in sorted(jobs, key=lambda j: j not in compiling):  # compiling jobs first
        sig = launcher_signature(job)
        first = sig is None or sig not in seen
        if sig is not None:
            seen.add(sig)
        if job in compiling or first:
            send.append((replace(job, launcher=first), job in compiling))
    return send


def compile_ahead(jobs: list[CompileJob], launchers: bool = True) -> int:
    """Compile `jobs` in the shared pool, so that loading them afterwards hits Triton's
    cache; how many compiled there. Jobs whose binaries Triton's cache holds, or this
    thread's binary source provides (`binary_source`), are not compiled. Where Triton
    builds a C launcher per kernel signature (`per_kernel_launchers`) and `launchers` is
    true (the loading thread will not launch them through torch's static launcher), the
    workers build those too, for cached binaries as well, so that loading compiles nothing.
    Raises CompileCrash naming a kernel that kills the compiler; other failures are left for
    the building thread to compile (and report)."""
    todo = _not_cached(jobs)
    if launchers and per_kernel_launchers():
        send = _with_launchers(jobs, todo)
    else:
        send = [(replace(j, launcher=False), True) for j in todo]
    pool = shared()
    if pool is None or len(send) < 2:  # one kernel compiles as fast here
        return 0
    results = pool.compile_all([job for job, _ in send])
    for (job, _), result in zip(send, results, strict=True):
        if result == CRASHED:
            raise CompileCrash(f"kernel {job.kernel} killed the Triton compiler (in a compile "
                               f"worker, twice); the graph cannot be built")
        if result is not None:
            log.debug("compile worker: kernel %s: %s", job.kernel, result)
    return sum(r is None and compiles for (_, compiles), r in zip(send, results, strict=True))
