"""Compile a built graph's kernels ahead of its first call: skip those Triton's cache holds,
ask this thread's binary source for the missing ones, compile the rest in the pool.

`Built.precompile` prepares every kernel before the first call. Compiling them one after
another on the building thread is most of a big model's first step, so instead:
1. on the building thread, Triton's JIT is asked, for each distinct launch, what it would
   compile (`specialize.specialization`), without compiling anything;
2. `compile_ahead` finds which of those Triton's cache lacks; a thread may name a binary
   source (`binary_source`; the client's is the kiln service, `kiln/binaries.py`) that is
   asked first for the missing ones by their Triton cache key (`job_key`) and writes those
   it has into Triton's cache (`binaries.install_binary`);
3. the pool's workers (compiler/aot/pool.py) compile the rest in parallel with
   `triton.compile`, which stores each binary in Triton's cache under the key the JIT
   computes for that launch;
4. back on the building thread, `warmup` finds each binary in the cache and loads it.
Nothing here is needed for correctness: when Triton does not report a specialisation, or a
worker cannot compile a kernel, the building thread compiles it. A kernel whose compile
kills a worker twice fails its build here (`CompileCrash`; never compiled in this process,
which it would kill too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from compiler.aot.binaries import is_cached
from compiler.aot.jobs import CompileJob, job_key, launcher_signature
from compiler.aot.launchers import per_kernel_launchers
from compiler.aot.pool import CRASHED, shared

log = logging.getLogger(__name__)


class CompileCrash(RuntimeError):
    """Compiling a kernel killed the compile worker, twice."""


# A function that takes compile jobs whose binaries are not in Triton's cache, writes those
# it can get (`install_binary`) and returns the cache keys it wrote; set per thread.
BinarySource = Callable[[list[CompileJob]], set[str]]
_sources = threading.local()


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
