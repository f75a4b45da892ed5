"""The one-time work of a process's first compile, paid before it is needed.

- `warm_up_early` / `warm_up`: when the backend is looked up (`kiln.backend`'s import),
  what touches no device (Triton's hash of itself in a child, dynamo's and kiln's
  first-compile imports, the decomposition table, a frozen heap);
- `start_compile_workers`: at the first compile, on a thread of its own, Triton's compile
  workers and loader.

Both run once per process (`PROCESS`), whichever configuration compiles.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import torch

import compiler
from kiln import config as kiln_config
from kiln import degrade

log = logging.getLogger("kiln")


@dataclass
class _Process:
    """What this process already started."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    warmed_up: bool = False  # `warm_up` ran
    preparing: threading.Thread | None = None  # compile workers and loader (`_prepare`)


PROCESS = _Process()


def warm_up_early() -> None:
    """When the backend is looked up (`torch.compile(..., backend="kiln")` imports
    `kiln.backend`), do the one-time work of a first compile that touches no device, as
    looking Inductor up does its own: Triton's hash of itself (0.5-1 s), which the first
    kernel load needs, in a child process (`compiler.runtime.triton_key`: on a thread here
    it slowed dynamo's tracing more than it cost); on this thread dynamo's and kiln's own
    first-compile imports (`kiln.preload`), kiln's decomposition table (0.1-0.2 s, which
    AOTAutograd or a plan's lowering needs; on a thread of its own it ran beside the first
    step's trace, which usually follows `torch.compile` at once, and slowed it as much) and
    a frozen heap (`preload.freeze_heap`). The device is left alone: which one this process
    uses may not be set yet (`_prepare` makes the driver at the first compile)."""
    if not torch.cuda.is_available():
        return
    from compiler.runtime.execution import runs_on_cpu

    if runs_on_cpu():  # the interpreter loads no kernel binaries
        return
    warm_up()


def warm_up() -> None:
    """The lookup's one-time work (`warm_up_early`), whatever the device, once per process:
    where kernels load it runs when `kiln.backend` is imported; `bench.trace_probe` calls it
    on any machine to measure what it does to dynamo's first trace."""
    from compiler.runtime import triton_key
    from kiln import preload

    with PROCESS.lock:
        if PROCESS.warmed_up:
            return
        PROCESS.warmed_up = True
    triton_key.start()
    preload.prime_dynamo()
    preload.import_compiler()
    with degrade.timed("prepare"):
        try:
            compiler.decompositions()
        except Exception as exc:  # noqa: BLE001 - the first compile pays for it instead
            log.debug("kiln: early warm-up failed: %s: %s", type(exc).__name__, exc)
    try:
        freeze = kiln_config.current().gc_freeze
    except ValueError:  # a bad setting: named by the first compile, which then runs eagerly
        freeze = False
    if freeze:
        preload.freeze_heap()


def start_compile_workers(expect_binaries: bool) -> None:
    """Once per process, on a thread of its own: pay what loading the first kernel here
    costs once (`prepare_loading`) while AOTAutograd traces, and without a service to load
    compiled kernels from, first start Triton's compile workers
    (compiler/aot/pool.py) so that they are ready when the first graph's
    kernels compile. With one that the client waits for (`expect_binaries`: wait mode, an
    async client builds new graphs here at once), workers start only when a kernel is to
    be compiled here: on a service hit none is, and starting 16 processes early cost the
    first step 0.3 s on an H200 host (2.51 s with them, 2.23 s without)."""
    if not torch.cuda.is_available():
        return
    with PROCESS.lock:
        if PROCESS.preparing is not None:
            return
        thread = PROCESS.preparing = threading.Thread(
            target=_prepare, args=(not expect_binaries,), name="kiln-prepare", daemon=True)
    thread.start()


def _prepare(start_workers: bool) -> None:
    from compiler import aot
    from compiler.runtime import loading

    start = time.perf_counter()
    try:
        if start_workers:
            aot.start()
    except Exception as exc:  # kernels then compile on the building thread
        log.warning("kiln: compile workers did not start (%s: %s); kernels compile one at a "
                    "time", type(exc).__name__, exc)
        return
    try:
        loading.prepare_loading()
    except Exception as exc:  # noqa: BLE001 - the first precompile pays for it instead
        log.debug("kiln: preparing Triton's loader failed: %s: %s", type(exc).__name__, exc)
    degrade.add_seconds("prepare", time.perf_counter() - start)
