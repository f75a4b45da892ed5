"""The one forkserver the service forks its children from (builds, request intake).

A process has a single forkserver, and its preload list counts only when the server
starts: whichever child comes first (a build in the embedded worker, or a submission's
intake) starts it, so both name the same list here. The server has kiln, torch and Triton
imported, so a forked child starts in milliseconds with them loaded, and no thread of the
API or the worker is forked.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

PRELOAD = ["service.pipeline", "compiler.lowering.frontend", "compiler.scheduling.heuristics",
           "compiler.runtime.built", "compiler.wire.graph", "compiler.wire.plan", "tuner.verify",
           "triton.language", "torch._dynamo", "service.intake_child"]


def context() -> Any:
    """The forkserver context, with the shared preload list."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
