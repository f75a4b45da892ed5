"""The benchmark's paths: eager step, torch.compile (Inductor) and kiln (trace, build, tune).

Each path returns a dict with `ms`, `first_call_s` and `error`; a path that is wrong or
fails has no time, and the error says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("bench.suite")


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step(fn: Callable[..., Any], case: Any) -> list[Any]:
    """One call of the case through `fn`; a training case also runs backward (ones grads)."""
    import torch

    from compiler.lowering.tracing import flat_tensors

    if not case.training:
        with torch.no_grad():
            return flat_tensors(fn(*case.inputs))
    params = list(case.module.parameters())
    leaves = [*case.inputs, *params]
    for t in leaves:
        t.grad = None
    out = fn(*case.inputs)
    out.backward(torch.ones_like(out))
    return [out.detach(), *[t.grad for t in leaves if t.requires_grad]]


def compiled_path(case: Any, mode: str | None, device: str, reference: list[Any]) -> dict:
    """torch.compile (Inductor) path: cold first call, correctness, steady-state time."""
    import torch

    from tuner.timing import time_fn
    from tuner.verify import check_outputs

    torch._dynamo.reset()
    start = time.perf_counter()
    compiled = torch.compile(case.module, mode=mode) if mode else torch.compile(case.module)
    out = step(compiled, case)
    sync(device)
    first = time.perf_counter() - start
    error = check_outputs(out, reference)
    if error:
        return {"ms": None, "first_call_s": first, "error": f"wrong_answer: {error}"}
    timing = time_fn(lambda: step(compiled, case), device)
    return {
        "ms": timing.median_ms,
        "noise_ms": timing.noise_ms,
        "first_call_s": first,
        "error": None,
    }


def trace(case: Any) -> list[tuple[Any, list[Any], Any]]:
    """The case's aten graphs as (compiler.Graph, inputs, aten GraphModule)."""
    import compiler
    from compiler.lowering.tracing import trace_inference, trace_training

    if case.training:
        fwd, bwd, fwd_in, bwd_in = trace_training(case.module, case.inputs)
        pairs = [(fwd, fwd_in), (bwd, bwd_in)]
    else:
        gm, ins = trace_inference(case.module, case.inputs)
        pairs = [(gm, ins)]
    return [(compiler.from_wire(compiler.to_wire(gm, ins)), list(ins), gm) for gm, ins in pairs]


def kiln_path(
    case: Any, device: str, schedules: list[Any] | None, target: Any
) -> tuple[dict, list[tuple[Any, list[Any], Any]]]:
    """Trace, build (heuristic, or the given schedules), verify per graph, time the sum."""
    import compiler
    from tuner.timing import time_fn
    from tuner.verify import Reference

    start = time.perf_counter()
    graphs = trace(case)
    builts = []
    for i, (graph, ins, _) in enumerate(graphs):
        sched = schedules[i] if schedules else compiler.heuristic_schedule(graph, target)
        built = compiler.build(graph, sched)
        built(*ins)
        builts.append(built)
    sync(device)
    first = time.perf_counter() - start
    total, noise, per_graph = 0.0, 0.0, []
    for (_graph, ins, gm), built in zip(graphs, builts, strict=True):
        ref = Reference.from_module(gm, ins)
        error = ref.check(built)
        if error:
            return {"ms": None, "first_call_s": first, "error": f"wrong_answer: {error}"}, graphs
        timing = time_fn(lambda b=built, x=ins: b(*x), device)
        total += timing.median_ms
        noise += timing.noise_ms
        per_graph.append(timing.median_ms)
    info = {
        "ms": total,
        "graph_ms": per_graph,
        "noise_ms": noise,
        "first_call_s": first,
        "error": None,
        "kernels": sum(len(b.kernels) for b in builts),
        "fallback_ops": sorted({op for b in builts for op in b.fallback_ops}),
    }
    return info, graphs


def tune_graphs(graphs: list, target: Any, runner: Any, budget: Any, strategy: str) -> dict:
    from collections import Counter

    from tuner.api import tune

    schedules, kernels, trials, seconds, errors = [], [], 0, 0.0, []
    failures: Counter[str] = Counter()
    per_graph = []
    for graph, _ins, _gm in graphs:
        result = tune(graph, target, budget, runner=runner, strategy=strategy)
        schedules.append(result.schedule)
        kernels.extend(k.to_json() for k in result.kernels)
        trials += result.trials
        seconds += result.seconds
        errors.extend(result.errors)
        failed = [m for m in result.measurements if m["error"]]
        failures.update(m["error"].split(":", 1)[0] for m in failed)
        per_graph.append(
            {
                k: getattr(result, k)
                for k in ("eager_ms", "heuristic_ms", "best_ms", "trials", "seconds")
            }
        )
        log.info(
            "tuned a graph: %d trials (%d failed) in %.1f s",
            result.trials,
            len(failed),
            result.seconds,
        )
    return {
        "schedules": schedules,
        "kernels": kernels,
        "trials": trials,
        "tuning_s": seconds,
        "tune_errors": errors,
        "failed_trials": dict(failures),
        "graphs": per_graph,
    }
