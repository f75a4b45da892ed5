"""What workers do with a job: the heuristic build (CPU) and tuning (GPU).

Both take the stored wire JSON and target JSON and return plain data for the store; both
raise on failure (the worker records the error and counts the attempt; a
`TargetCompileError` fails the job at once, since another attempt would fail the same way).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service import metrics
from service.target_compile import TargetCompile, compile_kernels, compile_schedule

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """A schedule to publish, its kernels (with sources), timings and measurements."""

    schedule: dict[str, Any]
    kernels: list[dict[str, Any]]
    timings: dict[str, float | None] = field(default_factory=dict)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    # compiled kernels for a CUDA target (`service.target_compile.TargetCompile.binaries`)
    binaries: list[dict[str, Any]] = field(default_factory=list)
    # where tuning timed the candidates, as the tuning child reported it (`cuda:N`)
    device: str | None = None


def _kernels(built: Any, compiled: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The kernels to store; `compiled` adds each kernel's compile facts for the target."""
    compiled = compiled or {}
    return [{"name": k.name, "kind": getattr(k, "kind", ""), "variant": getattr(k, "variant", ""),
             "config": dict(getattr(k, "config", {}) or {}), "nodes": list(getattr(k, "nodes", [])),
             "ops": list(getattr(k, "ops", [])), "source": k.source, "source_hash": k.source_hash,
             "compiled": compiled.get(k.name)}
            for k in built.kernels]


def tensor_sizes(graph: Any) -> tuple[int, int]:
    """(largest, total) elements over every tensor the graph makes or reads: inputs,
    constants and every node's result (intermediates included), from the checked metas."""
    sizes = [math.prod(t.shape) for t in (*graph.inputs, *graph.constants)]
    for node in graph.nodes:
        metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
        sizes += [math.prod(m.shape) for m in metas if hasattr(m, "shape")]
    return max(sizes, default=0), sum(sizes)


# All tensors of a checked graph together, in units of the largest one allowed: the
# reference run keeps every intermediate alive, so a long graph of small tensors is bounded too.
INTERPRET_TOTAL_FACTOR = 32


def interpreter_refusal(graph: Any, interpret_max_numel: int) -> str | None:
    """Why the graph is too large to check on the Triton interpreter, or None."""
    largest, total = tensor_sizes(graph)
    if largest > interpret_max_numel:
        return (f"its largest tensor has {largest} elements > KILN_INTERPRET_MAX_NUMEL="
                f"{interpret_max_numel}")
    if total > INTERPRET_TOTAL_FACTOR * interpret_max_numel:
        return (f"its tensors hold {total} elements together > {INTERPRET_TOTAL_FACTOR} x "
                f"KILN_INTERPRET_MAX_NUMEL={interpret_max_numel}")
    return None


def _check_on_interpreter(graph: Any, built: Any) -> None:
    """Run the heuristic build on seeded inputs and compare with the rebuilt aten graph,
    with the tuner's verification (same RNG state for random ops, dtype-aware tolerances)."""
    from tuner.verify import Reference

    reason = Reference.compute(graph, seed=0).check(built)
    if reason is not None:
        raise ValueError(f"the heuristic build disagrees with the aten graph: {reason}")


def build_kernels(wire: str, target_json: dict[str, Any], interpret_max_numel: int,
                  max_build_cost: int = 0, compiling: Callable[[], None] | None = None) -> Outcome:
    """The whole heuristic build, in this process: parse the graph, then once its price
    (`compiler.lowering.budget`) is within `max_build_cost` (0: no limit; past it
    `BuildRefused`, before any lowering), lower, fuse and generate the heuristic schedule's
    kernels for the target. For a CPU target whose every tensor (intermediates included)
    is small, check the build's outputs on the Triton interpreter; a larger one is published
    unchecked, with the reason in the note. For a CUDA target, compile every kernel for its
    architecture (`service.target_compile.compile_kernels`; `compiling` is called first):
    each kernel's compile facts and the binaries go into the outcome, and a kernel that does
    not compile or fit raises `TargetCompileError`. A CUDA target needs a process whose
    Triton was imported with the interpreter off: `service.build_child` runs this in a
    child forked from such a server, the graph parsed, lowered and built once per job."""
    import compiler
    from compiler.lowering import budget

    graph = compiler.from_wire(wire)
    budget.check(graph, max_build_cost)
    target = compiler.Target.from_json(target_json)
    built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
    note = "heuristic build"
    compiled = None
    if target.device_type == "cpu":
        refusal = interpreter_refusal(graph, interpret_max_numel)
        if refusal is None:
            _check_on_interpreter(graph, built)
            note = "heuristic build, checked on the Triton interpreter"
        else:
            note = f"heuristic build, not checked on the Triton interpreter: {refusal}"
    elif target.device_type == "cuda" and built.kernels:
        if compiling is not None:
            compiling()
        compiled = compile_kernels(built, target)
        note = f"heuristic build, {len(compiled.facts)} kernels compiled for {target.arch}"
    outcome = Outcome(schedule=built.schedule.to_json(), kernels=_kernels(built), note=note)
    if compiled is not None:
        _attach(outcome, compiled)
    return outcome


def _attach(outcome: Outcome, compiled: TargetCompile) -> None:
    """A target compile's facts onto `outcome`'s kernels, and its binaries."""
    for kernel in outcome.kernels:
        kernel["compiled"] = compiled.facts.get(kernel["name"])
    outcome.binaries = compiled.binaries


def tune(wire: str, target_json: dict[str, Any], trials: int, seconds: float,
         device: str | None = None, progress: Callable[[float], None] | None = None) -> Outcome:
    """Tune on `device` (default: the tuner's choice for the target); the tuned schedule with
    every measurement. `progress` receives the fraction of the search done."""
    import compiler
    import tuner

    graph = compiler.from_wire(wire)
    target = compiler.Target.from_json(target_json)
    start = time.monotonic()

    def report(done: int, total: int, _kernel: str) -> None:
        if progress is not None and total:
            progress(done / total)

    result = tuner.tune(graph, target, tuner.Budget(trials=trials, seconds=seconds),
                        device=device, progress=report)
    built = compiler.build(graph, result.schedule)
    kernels = _kernels(built)
    measurements = [dict(m) for m in result.measurements]
    # a twin (the same kernel elsewhere in the graph) was measured as the kernel it twins
    measured_as = {r.name: r.twin_of for r in getattr(result, "kernels", []) if r.twin_of}
    for k in kernels:  # each kernel's tuned time: its winning config's best verified run
        name = measured_as.get(k["name"], k["name"])
        times = [m["ms"] for m in measurements if m.get("kernel") == name
                 and m.get("config") == k["config"] and m.get("ms") is not None and m.get("verified")]
        k["tuned_ms"] = min(times) if times else None
    outcome = Outcome(
        schedule=built.schedule.to_json(), kernels=kernels, measurements=measurements,
        timings={"eager_ms": result.eager_ms, "heuristic_ms": result.heuristic_ms,
                 "tuned_ms": result.best_ms,
                 "tuning_s": getattr(result, "seconds", None) or time.monotonic() - start},
        note="; ".join([f"tuned: {len(measurements)} candidates measured, "
                        f"{_changed_kernels(result)} of {len(kernels)} kernels changed config",
                        *result.errors])[:4000],
        device=getattr(result, "device", None))
    return _with_binaries(wire, target_json, outcome)


def _changed_kernels(result: Any) -> int:
    """How many kernels of the published schedule run another variant or config than the
    heuristic's: an entry is `tuned` even when none does (every candidate lost, or the whole
    graph got slower), and the job note says so."""
    heuristic = {r.name: (r.heuristic.variant, dict(r.heuristic.config_items))
                 for r in getattr(result, "kernels", [])}
    return sum(1 for k in result.schedule.kernels
               if k.name in heuristic and heuristic[k.name] != (k.variant, dict(k.config)))


def _with_binaries(wire: str, target_json: dict[str, Any], outcome: Outcome) -> Outcome:
    """A tuned CUDA schedule's kernel binaries and compile facts (what the heuristic build
    gets in its child), compiled in a child of their own (`compile_schedule`), so that a
    client on a hit compiles nothing. The tuner compiled the winners already (mostly hits
    in Triton's cache); a failure here keeps the tuned schedule, without binaries (clients
    compile them)."""
    if target_json.get("device_type") != "cuda" or not outcome.kernels:
        return outcome
    try:
        with metrics.timed("target_compile"):
            _attach(outcome, compile_schedule(wire, outcome.schedule))
    except Exception as exc:  # noqa: BLE001 - binaries are an optimisation
        log.warning("no binaries for the tuned schedule: %s: %s", type(exc).__name__, exc)
    return outcome
