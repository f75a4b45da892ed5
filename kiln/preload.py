"""What a process's first compile imports and caches once, done when the backend is
looked up (`torch.compile(..., backend="kiln")`) instead of inside the first step.

Looking Inductor up does the same: it imports `torch._inductor.compile_fx` and, with it,
its compiler and what dynamo's first trace needs (the `torch.compile` call took 4.4-4.9 s
with Inductor against 1.5-1.9 s with kiln on an H200 host, before this module).

- `prime_dynamo`: dynamo's first trace pays a few one-time costs lazily, where they are
  dearest: the first FX node it creates asks `uninteresting_files()` (symbolic_shapes; it
  imports `torch.export._trace` and a dozen modules), and the first module attribute it
  wraps imports `torch.distributed.tensor.experimental._func_map` (which registers custom
  ops with the dispatcher). Inside the trace they cost far more than outside it: on this
  project's CI machine resnet18's first trace with a backend other than Inductor took
  1.29-1.62 s, 1.17-1.34 s once primed after `torch.compile` (priming: 0.04-0.05 s).
- `prime_dynamo` also loads dynamo's backend registry (`torch._dynamo.list_backends()`: its
  backend modules and the installed packages' entry points, 0.1-0.3 s on an H200 host with
  many packages): a backend given by name loads it at `torch.compile`, but one given as a
  callable (`backend=kiln.remote_compile`) had dynamo load it at the end of the first
  compile (`clear_compile_context_weakrefs` asks whether the backend is a registered one).
- `import_compiler`: the modules a graph's lowering, build and kernel loading import on
  their first use (kiln's compiler; Triton's JIT binder imports `triton.experimental.gluon`,
  51 modules, at the first kernel it specialises): 0.2 s on the CI machine with bytecode
  caches, more without; on a service hit they were imported on the compiling threads.
- `freeze_heap`: a full collection of the cyclic garbage collector visits every object the
  process holds (torch, Triton, kiln, the model: 350,000 objects or more), and the
  allocations of dynamo's first trace and of a first compile start one now and then, when
  enough new objects have piled up since the last: on the CI machine a first trace of GPT
  or resnet18 met one of 0.20-0.26 s when nothing was looked up before it; on an H200 host
  dynamo's `create_proxy`, where such a collection landed, took 0.28-0.38 s in kiln's
  processes before this and 0.07-0.13 s after (Inductor's: 0.09-0.11). After one collection
  of what the imports left, `gc.freeze()` moves everything the process holds to the
  collector's permanent generation, which later collections skip (still freed when no
  longer referenced; only cycles among those objects stay). `KILN_GC_FREEZE=0` leaves
  the collector alone.

All run on the calling thread (an import on another thread could race the training
thread's own) and never raise: a module another torch or Triton lacks is skipped.
"""

from __future__ import annotations

import gc
import importlib
import logging

log = logging.getLogger("kiln")

# Modules dynamo imports the first time it wraps a module attribute (torch 2.11-2.13).
FIRST_TRACE_IMPORTS = ("torch.distributed.tensor.experimental._func_map",)
# What lowering, building, loading and planning a graph import (kiln's compiler is lazy).
COMPILER_IMPORTS = (
    "compiler.lowering.frontend", "compiler.scheduling.heuristics", "compiler.runtime.built",
    "compiler.runtime.launcher", "compiler.runtime.static_launch", "compiler.wire.plan",
    "compiler.wire.keys",  # a dynamo graph's plan key
    "kiln.plans", "kiln.resolve",
    "triton.compiler.compiler", "triton.experimental.gluon",
)


def prime_dynamo() -> None:
    """Pay dynamo's first-trace costs now."""
    try:
        from torch.fx.experimental.symbolic_shapes import uninteresting_files

        uninteresting_files()  # cached for the process
    except Exception as exc:  # noqa: BLE001 - another torch: its first trace pays as before
        log.debug("kiln: dynamo's file filter not primed: %s: %s", type(exc).__name__, exc)
    _import(FIRST_TRACE_IMPORTS)
    try:
        import torch._dynamo

        torch._dynamo.list_backends()  # cached for the process
    except Exception as exc:  # noqa: BLE001 - another torch: its first compile pays as before
        log.debug("kiln: dynamo's backend registry not loaded: %s: %s", type(exc).__name__, exc)


def freeze_heap() -> None:
    """Collect what is garbage now, then freeze everything else (`gc.freeze`)."""
    gc.collect()
    gc.freeze()


def import_compiler() -> None:
    """Import what the first graph's compile imports."""
    _import(COMPILER_IMPORTS)


def _import(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - e.g. a torch built without distributed
            log.debug("kiln: %s not imported ahead: %s: %s", name, type(exc).__name__, exc)
