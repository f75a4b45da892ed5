"""A compile worker: the loop of the fresh Python process the pool starts (`serve`), and the
compile of one job in it (`compile_job`).

A worker imports Triton with the interpreter off and neither torch nor CUDA, warms up
(Triton's own cache key) before its first job, and exchanges JSON lines with the process
that started it (compiler/aot/pool.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from compiler.aot.jobs import CompileJob
from compiler.aot.launchers import build_launcher
from compiler.aot.sources import import_kernel
from compiler.aot.triton_compile import compile_spec

log = logging.getLogger(__name__)

_modules: dict[str, Any] = {}  # source hash -> the kernel's module, imported once a worker


def warm() -> int:
    """Pay, before the first job, what a worker's first compile costs once: Triton's import
    and its own cache key (a hash of its sources and its ~500 MB library, which every
    compile's cache key includes)."""
    import triton.compiler  # noqa: F401
    from triton.runtime.cache import triton_key

    triton_key()
    return os.getpid()


def one_line(exc: Exception) -> str:
    """An error as one line of at most 500 characters, its type first."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]


def compile_job(job: CompileJob) -> str | None:
    """Compile one job into Triton's cache, and on a Triton that builds a C launcher per
    kernel signature, its launcher too (`build_launcher`; for a job whose binary is cached
    already, only that): None, or why it did not (one line)."""
    try:
        kernel = _compile(job)
    except Exception as exc:  # Triton's errors span many types; the caller compiles again
        return one_line(exc)
    if job.launcher:
        try:
            build_launcher(kernel)
        except Exception as exc:  # noqa: BLE001 - the building thread builds it then
            return f"launcher: {one_line(exc)}"
    return None


def _compile(job: CompileJob) -> Any:
    module = _modules.get(job.source_hash)
    if module is None:
        module = _modules[job.source_hash] = import_kernel(job.source, job.source_hash)
    return compile_spec(getattr(module, job.fn_name), job.spec)


def serve(fd: int) -> None:
    """A compile worker's loop: one JSON request a line on stdin (`run`: "module:function"
    taking a CompileJob, `job`: its fields), one JSON answer a line on `fd` (`result`);
    returns when stdin closes. The worker's own stdout goes to stderr, so that nothing a
    compiler prints can interleave with the answers."""
    answers = os.fdopen(fd, "w")
    os.dup2(2, 1)
    try:
        warm()
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
            result = one_line(exc)
        answers.write(json.dumps({"result": result}) + "\n")
        answers.flush()
