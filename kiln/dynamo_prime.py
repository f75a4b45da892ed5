"""What dynamo's first trace of a model does once per process, done when the backend is
looked up instead of inside that trace.

Dynamo's first trace pays a few one-time costs lazily, where they are dearest: the first
FX node it creates asks `uninteresting_files()` (symbolic_shapes; it imports
`torch.export._trace` and a dozen modules), and the first module attribute it wraps imports
`torch.distributed.tensor.experimental._func_map` (which registers custom ops with the
dispatcher). Done inside the trace they cost far more than their imports do outside it:
on this project's CI machine resnet18's first trace with a backend other than Inductor took
1.29-1.62 s, 1.17-1.34 s when `prime` had run after `torch.compile` (it takes 0.04-0.05 s
then). Inductor pays them before the first step too: looking its backend up imports
`torch._inductor.compile_fx`, which imports them. Private names of torch: what is missing
in another version is skipped.
"""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger("kiln")

# Modules dynamo imports the first time it wraps a module attribute (torch 2.11-2.13).
FIRST_TRACE_IMPORTS = ("torch.distributed.tensor.experimental._func_map",)


def prime() -> None:
    """Pay dynamo's first-trace costs now, on the calling thread (imports on another
    thread could race the training thread's own). Never raises."""
    try:
        from torch.fx.experimental.symbolic_shapes import uninteresting_files

        uninteresting_files()  # cached for the process
    except Exception as exc:  # noqa: BLE001 - another torch: its first trace pays as before
        log.debug("kiln: dynamo's file filter not primed: %s: %s", type(exc).__name__, exc)
    for name in FIRST_TRACE_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - e.g. a torch built without distributed
            log.debug("kiln: %s not imported ahead: %s: %s", name, type(exc).__name__, exc)
