"""What each CUDA graph of a kiln step copies per replay.

    KILN_URL=off python -m bench.graph_runners --model vit_b16 --step train

Runs a model suite case through kiln for a few steps, then reports every graph runner
(`compiler.runtime.cudagraphs.GraphRunner`) of the process: its inputs read in place and
those copied in before each replay (count and MiB), its outputs and those copied out after
each replay (a caller held them when a replay came), its replays, captures made again and
whether it gave up. A copy in or out is a device-to-device memcpy of every step.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from typing import Any

import torch

from bench.measure import synchronizer
from bench.models import add_case_arguments, compiled, instantiate, step_fn


def runner_report(runner: Any) -> dict[str, Any]:
    from compiler.runtime.cudagraphs import _Out

    staged_bytes = sum(t.numel() * t.element_size() for t in runner.static
                       if isinstance(t, torch.Tensor))
    outputs = [o for o in runner.layout if type(o) is _Out]
    return {"inputs_in_place": len(runner.direct), "inputs_copied": len(runner.staged),
            "inputs_copied_mib": round(staged_bytes / 2**20, 2), "outputs": len(outputs),
            "outputs_copied_out": len(runner.copy_at), "output_storages": len(runner.bases),
            "storages_copied": len(runner.copied), "replays": runner.replays,
            "recaptures": runner.recaptures, "gave_up": runner.failed}


def _is_runner(obj: Any, cls: type) -> bool:
    try:
        return isinstance(obj, cls)
    except ReferenceError:  # a dead weak proxy among the heap's objects
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.graph_runners", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(parser)
    parser.add_argument("--path", default="kiln_heuristic")
    args = parser.parse_args(argv)
    from compiler.runtime.cudagraphs import GraphRunner

    device = torch.device(args.device)
    sync = synchronizer(device)
    case, module, inputs = instantiate(args.model, device, args.small)
    step = step_fn(case, args.step, compiled(args.path, module), inputs)
    for _ in range(args.iters):
        step()
    sync()
    runners = [o for o in gc.get_objects() if _is_runner(o, GraphRunner)]
    reports = [runner_report(r) for r in runners]
    # A gradient autograd took over as it was (stolen) lives in a graph's output memory; one
    # it cloned (strides or references it could not take) lives elsewhere: a copy per step.
    graph_memory = {b.untyped_storage().data_ptr() for r in runners for b in r.bases}
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    stolen = sum(g.untyped_storage().data_ptr() in graph_memory for g in grads)
    json.dump({"model": args.model, "step": args.step, "runners": reports,
               "grads": len(grads), "grads_in_graph_memory": stolen}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
