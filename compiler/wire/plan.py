"""The kiln.plan/1 format: what AOTAutograd made of one dynamo graph, so that a later
process with the same graph skips AOTAutograd's trace and partition.

A plan holds the forward (or inference) and backward aten graphs in the wire format, and
the few facts AOTAutograd's runtime needs to run them (kiln/plans.py runs them):

- `inputs`: how many inputs the dynamo graph takes (the forward's inputs, in order);
- `mutated_inputs`: inputs the graph mutates; the forward's first outputs are their new
  values, which the runtime copies into them;
- `outputs`: one entry per user output (`requires_grad`; `unsafe_view`, present and true
  for an output the graph returns as a view of a value it computed, which the runtime hands
  out as a tensor of its own, `aten._unsafe_view`, as AOTAutograd does), after those values;
  in a training plan the forward's remaining outputs are saved for the backward;
- `backward` (training only) takes the saved values, then one gradient per output that
  requires grad, and returns one gradient (or null) per input.

Only plans of that plain shape exist: no output aliases an input or another output, no
input's metadata is mutated, no mutated input requires grad or is saved for the backward.
Parsing checks all of that and every graph (`from_wire`), so a plan is data that kiln
runs only through code it generates itself, never code that travelled.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from compiler.wire.decode import TensorMeta
from compiler.wire.graph import Graph, WireError, from_wire, parse_json
from compiler.wire.limits import limits

FORMAT = "kiln.plan/1"
KINDS = ("training", "inference")
_KEY = re.compile(r"[0-9a-f]{64}")
_FIELDS = {"format", "key", "kind", "inputs", "mutated_inputs", "outputs", "forward", "backward"}
_OUTPUT_FIELDS = {"requires_grad", "unsafe_view"}


class PlanError(ValueError):
    """A plan document that does not conform; the message says why."""


@dataclass(frozen=True)
class Plan:
    """A parsed, checked kiln.plan/1 document."""

    key: str
    kind: str
    inputs: int
    mutated_inputs: tuple[int, ...]
    output_requires_grad: tuple[bool, ...]
    forward: Graph
    backward: Graph | None
    unsafe_views: tuple[int, ...] = ()  # user outputs handed out as tensors of their own

    @property
    def saved(self) -> int:
        """How many forward outputs a training plan saves for its backward."""
        return len(self.forward.outputs) - len(self.mutated_inputs) - len(self.output_requires_grad)

    @property
    def tangents(self) -> tuple[int, ...]:
        """The user outputs whose gradients the backward takes, in its order."""
        return tuple(i for i, rg in enumerate(self.output_requires_grad) if rg)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "key": self.key, "kind": self.kind, "inputs": self.inputs,
                "mutated_inputs": list(self.mutated_inputs),
                "outputs": [{"requires_grad": rg, **({"unsafe_view": True}
                                                      if i in self.unsafe_views else {})}
                            for i, rg in enumerate(self.output_requires_grad)],
                "forward": self.forward.to_json(),
                "backward": self.backward.to_json() if self.backward is not None else None}


def max_plan_bytes() -> int:
    """A plan's JSON text may hold two graphs of the largest size a graph may have."""
    return 2 * limits().max_body_bytes


def parse_plan(obj: dict[str, Any] | str | bytes | bytearray, *,
               cancel: threading.Event | None = None) -> Plan:
    """Parse and check a kiln.plan/1 document (a dict, JSON text or UTF-8 bytes); raises
    `PlanError` naming what is wrong (a graph's own errors as `WireError`'s message). With
    `cancel`, setting the event stops the graphs' validation (`ValidationCancelled`)."""
    if isinstance(obj, (str, bytes, bytearray)):
        try:
            obj = parse_json(obj, max_bytes=max_plan_bytes())
        except WireError as exc:
            raise PlanError(f"plan: {exc}") from None
    if not isinstance(obj, dict):
        raise PlanError("a plan is a JSON object")
    unknown = set(obj) - _FIELDS
    if unknown:
        raise PlanError(f"plan: unknown fields {sorted(unknown)}")
    if obj.get("format") != FORMAT:
        raise PlanError(f"plan: format must be {FORMAT!r}")
    key, kind = obj.get("key"), obj.get("kind")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise PlanError("plan: key must be 64 lowercase hex digits")
    if kind not in KINDS:
        raise PlanError(f"plan: kind must be one of {KINDS}")
    inputs = _count(obj.get("inputs"), "inputs")
    mutated = obj.get("mutated_inputs")
    if (not isinstance(mutated, list) or any(type(i) is not int or not 0 <= i < inputs
                                             for i in mutated) or mutated != sorted(set(mutated))):
        raise PlanError("plan: mutated_inputs must be sorted, distinct input positions")
    outputs = obj.get("outputs")
    if not isinstance(outputs, list) or not all(
            isinstance(o, dict) and "requires_grad" in o and set(o) <= _OUTPUT_FIELDS
            and type(o["requires_grad"]) is bool and o.get("unsafe_view", True) is True
            for o in outputs):
        raise PlanError('plan: outputs must be a list of {"requires_grad": bool} '
                        '(with "unsafe_view": true where it applies)')
    backward = obj.get("backward")
    return make_plan(key, kind, tuple(mutated), tuple(o["requires_grad"] for o in outputs),
                     _graph(obj.get("forward"), "forward", cancel),
                     _graph(backward, "backward", cancel) if backward is not None else None,
                     inputs=inputs,
                     unsafe_views=tuple(i for i, o in enumerate(outputs) if "unsafe_view" in o))


def make_plan(key: str, kind: str, mutated_inputs: tuple[int, ...],
              output_requires_grad: tuple[bool, ...], forward: Graph, backward: Graph | None,
              inputs: int | None = None, unsafe_views: tuple[int, ...] = ()) -> Plan:
    """A plan of graphs already checked (`from_wire`), checked as `parse_plan` checks one;
    `inputs` defaults to the forward's."""
    plan = Plan(key=key, kind=kind,
                inputs=len(forward.inputs) if inputs is None else inputs,
                mutated_inputs=mutated_inputs, output_requires_grad=output_requires_grad,
                forward=forward, backward=backward, unsafe_views=unsafe_views)
    _check_shapes(plan)
    return plan


def _count(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise PlanError(f"plan: {name} must be a non-negative integer")
    return value


def _graph(doc: Any, role: str, cancel: threading.Event | None) -> Graph:
    if not isinstance(doc, dict):
        raise PlanError(f"plan: {role} must be a kiln.graph/1 object")
    try:
        return from_wire(doc, cancel=cancel)
    except WireError as exc:
        raise PlanError(f"plan: {role} graph: {exc}") from None


def _check_shapes(plan: Plan) -> None:
    """The graphs fit the plan's counts, and the plan is of the plain shape kiln runs."""
    forward, backward = plan.forward, plan.backward
    if plan.kind not in KINDS:
        raise PlanError(f"plan: kind must be one of {KINDS}")
    if len(forward.inputs) != plan.inputs:
        raise PlanError(f"plan: the forward takes {len(forward.inputs)} inputs, not {plan.inputs}")
    returned = len(plan.mutated_inputs) + len(plan.output_requires_grad)
    if any(not 0 <= i < len(plan.output_requires_grad) for i in plan.unsafe_views):
        raise PlanError("plan: an unsafe view names no output")
    if any(ref is None for ref in forward.outputs):
        raise PlanError("plan: the forward returns None")
    layouts = tensor_layouts(forward)
    for i, ref in zip(plan.mutated_inputs, forward.outputs, strict=False):
        spec = forward.inputs[i]
        if layouts.get(ref.name) != (spec.shape, spec.dtype):
            raise PlanError(f"plan: the new value of input {spec.name} is not of its shape "
                            "and dtype")
    if plan.kind == "inference":
        if backward is not None or len(forward.outputs) != returned:
            raise PlanError("plan: an inference plan has no backward and returns exactly its "
                            "mutated inputs' values and its outputs")
        return
    if backward is None:
        raise PlanError("plan: a training plan needs its backward")
    if plan.saved < 0:
        raise PlanError("plan: the forward returns fewer values than the plan lists")
    if len(backward.inputs) != plan.saved + len(plan.tangents):
        raise PlanError(f"plan: the backward takes {len(backward.inputs)} inputs, not "
                        f"{plan.saved} saved values and {len(plan.tangents)} gradients")
    if len(backward.outputs) != plan.inputs:
        raise PlanError(f"plan: the backward returns {len(backward.outputs)} values, not one "
                        f"per input ({plan.inputs})")
    names = [spec.name for spec in forward.inputs]
    mutated = {names[i] for i in plan.mutated_inputs}
    saved = forward.outputs[returned:]
    if any(ref.name in mutated for ref in saved if ref is not None):
        raise PlanError("plan: a mutated input is saved for the backward")
    if any(forward.inputs[i].requires_grad for i in plan.mutated_inputs):
        raise PlanError("plan: a mutated input requires grad")


def tensor_layouts(graph: Graph) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Shape and dtype of each tensor `graph` names: inputs, constants and nodes."""
    layouts = {spec.name: (tuple(spec.shape), spec.dtype)
               for spec in (*graph.inputs, *graph.constants)}
    for node in graph.nodes:
        if isinstance(node.meta, TensorMeta):
            layouts[node.name] = (tuple(node.meta.shape), node.meta.dtype)
    return layouts


def plan_text(plan: Plan) -> str:
    """The plan's JSON text, keys sorted: what is stored and sent."""
    return json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)
