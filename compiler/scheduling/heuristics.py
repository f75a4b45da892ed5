"""Schedules chosen without measuring: each kernel's variant and config from its kind's
heuristic (`compiler.codegen.kinds`), from sizes, dtypes and the target."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compiler.codegen import kinds
from compiler.ir import ExternStep, Program, op_name
from compiler.lowering.frontend import lower_graph
from compiler.scheduling.schedule import KernelChoice, Schedule

__all__ = ["extern_ops", "heuristic_schedule", "schedule_for"]


def _target_json(target: Any) -> dict[str, Any]:
    if target is None:
        return {}
    if hasattr(target, "to_json"):
        return target.to_json()
    if isinstance(target, dict):
        return dict(target)
    raise TypeError(f"target must be a compiler.Target or its JSON, got {type(target).__name__}")


def _is_gpu(target: dict[str, Any]) -> bool:
    return target.get("device_type", "cpu") != "cpu"


def schedule_for(program: Program, ghash: str, target: Any) -> Schedule:
    """The heuristic schedule of a lowered program."""
    tj = _target_json(target)
    gpu = _is_gpu(tj)
    kernels = []
    for group in program.kernels:
        variant, config = kinds.heuristic(group, gpu, str(tj.get("arch", "")))
        kernels.append(KernelChoice(
            name=group.name, kind=group.kind, variant=variant,
            nodes=tuple(program.origin_names(group.members + group.inlined)),
            sizes=group.sizes, dtype=str(group.dtype).removeprefix("torch."), config=config))
    return Schedule(graph_hash=ghash, target=tj, kernels=tuple(kernels),
                    externs=tuple(sorted(extern_ops(program))))


def extern_ops(program: Program) -> set[str]:
    """Op names of the program's ATen calls (tuple indexing is not a call)."""
    return {op_name(s.node) for s in program.steps
            if isinstance(s, ExternStep) and op_name(s.node) != "operator.getitem"}


def heuristic_schedule(graph: Any, target: Any = None,
                       example_inputs: Sequence[Any] | None = None) -> Schedule:
    """A schedule for `graph` (a `compiler.Graph`, or an fx GraphModule with
    `example_inputs`) on `target`, without measuring anything."""
    program, ghash = lower_graph(graph, example_inputs)
    return schedule_for(program, ghash, target)
