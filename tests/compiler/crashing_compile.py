"""A stand-in for `compiler.aot.worker.compile_job` that kills its worker on one kernel (what a
compiler crash does), for tests/compiler/test_compile_pool.py; imported by spawned workers."""

from __future__ import annotations

import os

from compiler.aot import CompileJob


def crash_on_boom(job: CompileJob) -> str | None:
    if job.kernel == "boom":
        os._exit(139)
    return None if job.kernel.startswith("ok") else f"CompilationError: {job.kernel}"
