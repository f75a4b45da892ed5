"""Where an exact-dtype output (bool, integer) may differ from the reference without being wrong.

A bool mask `x > 0` or a max-pool's argmax index is exact, but it is computed from floats:
where the float operands sit within rounding of the threshold (or two candidates of a max
are within rounding of each other), a kernel that rounds differently from eager flips the
element legitimately. Bit equality cries wolf there (a ReLU mask saved for the backward,
4 of 6.4M elements). So, for each exact output that comes from a float comparison or an
arg-max/min, the reference run records where such a flip is allowed, and only flips there
are forgiven; any other difference is still a wrong answer.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
# Ops that move elements without changing them: a mask's slack moves the same way.
MOVES = frozenset({"view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand",
                   "unsqueeze", "squeeze", "slice", "select", "clone", "contiguous", "alias",
                   "flatten", "unflatten", "repeat"})
CASTS = frozenset({"convert_element_type", "_to_copy", "to"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
                     "bitwise_or", "bitwise_xor", "bitwise_not"})
# Ops whose result `index` is an arg-max/min over windows or a dim of their first input.
ARG_OPS = {"max_pool2d_with_indices": 1, "max_pool3d_with_indices": 1, "max": 1, "min": 1,
           "argmax": 0, "argmin": 0}


def _name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", "") if packet is not None else ""


def near(a: torch.Tensor, b: Any, tol: tuple[float, float, float]) -> torch.Tensor:
    """Where `a` and `b` are within the dtype's rounding tolerance of each other."""
    _norm, rtol, atol_frac = tol
    a64 = a.double()
    b64 = b.double() if isinstance(b, torch.Tensor) else torch.tensor(float(b), dtype=torch.float64,
                                                                       device=a.device)
    scale = torch.maximum(a64.abs().max() if a64.numel() else a64.new_zeros(()),
                          b64.abs().max() if b64.numel() else b64.new_zeros(()))
    bound = rtol * torch.maximum(a64.abs(), b64.abs()) + atol_frac * scale
    return (a64 - b64).abs() <= bound


@dataclass
class ArgSlack:
    """An arg-max/min output: the values it chose among, laid out so that `gather` along
    `dim` of `values` with the index picks the chosen value."""

    values: torch.Tensor
    dim: int
    flatten: int  # trailing dims flattened before gathering (pooling: 2 or 3; argmax(None): all)
    keepdim: bool

    def chosen(self, index: torch.Tensor) -> torch.Tensor:
        idx = index.to(self.values.device, torch.int64)
        values = self.values
        if self.flatten:
            values = values.flatten(-self.flatten) if self.flatten <= values.dim() else values.flatten()
            idx = idx.flatten(-self.flatten) if self.flatten <= idx.dim() else idx.flatten()
            return values.gather(-1, idx.reshape(*values.shape[:-1], -1))
        if not self.keepdim:
            idx = idx.unsqueeze(self.dim)
        return values.gather(self.dim, idx)


class Slack:
    """For one exact output: where a difference from the reference is forgiven."""

    def __init__(self, mask: torch.Tensor | None = None, arg: ArgSlack | None = None,
                 tol: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        self.mask, self.arg, self.tol = mask, arg, tol

    def forgives(self, out: torch.Tensor, ref: torch.Tensor) -> bool:
        """Whether every element where `out` differs from `ref` is a legitimate flip."""
        differ = out.to(ref.device) != ref
        if self.mask is not None:
            return not bool((differ & ~self.mask.to(ref.device).expand_as(differ)).any())
        assert self.arg is not None
        try:
            ties = near(self.arg.chosen(out), self.arg.chosen(ref), self.tol)
        except (RuntimeError, IndexError):  # an index out of range is simply wrong
            return False
        return not bool((differ & ~ties.reshape(differ.shape)).any())


def _float_tol(t: Any, tolerance: Callable[[torch.dtype], tuple[float, float, float]]) -> Any:
    return tolerance(t.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else None


class _SlackRecorder(fx.Interpreter):
    """Runs the graph and, beside the values, carries a slack for every exact value that
    descends from a float comparison (through moves, casts and logic) or an arg-max/min."""

    def __init__(self, gm: fx.GraphModule,
                 tolerance: Callable[[torch.dtype], tuple[float, float, float]]) -> None:
        super().__init__(gm)
        self.tolerance = tolerance
        self.slack: dict[fx.Node, Slack] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n.op == "call_function":
            found = self._slack_of(n, result)
            if found is not None:
                self.slack[n] = found
        return result

    def _value(self, a: Any) -> Any:
        return self.env.get(a) if isinstance(a, fx.Node) else a

    def _slack_of(self, n: fx.Node, result: Any) -> Slack | None:
        name = _name(n.target)
        args = [self._value(a) for a in n.args]
        if name in COMPARISONS and len(args) >= 2:
            tol = _float_tol(args[0], self.tolerance) or _float_tol(args[1], self.tolerance)
            if tol is None:
                return None
            a, b = (args[0], args[1]) if isinstance(args[0], torch.Tensor) else (args[1], args[0])
            return Slack(mask=near(a, b, tol).expand(result.shape), tol=tol)
        sources = [self.slack[a] for a in n.args if isinstance(a, fx.Node) and a in self.slack]
        if n.target is operator.getitem:
            base = n.args[0]
            pending = self.slack.get(base) if isinstance(base, fx.Node) else None
            if pending is not None and pending.arg is not None and n.args[1] == ARG_OPS.get(
                    _name(base.target)):
                return pending
            return None
        if name in ARG_OPS:
            return self._arg_slack(n, name, args)
        masks = [s.mask for s in sources if s.mask is not None]
        if not masks or not isinstance(result, torch.Tensor):
            return None
        if name in CASTS:
            return Slack(mask=masks[0], tol=sources[0].tol)
        if name in MOVES and n.args and n.args[0] in self.slack:
            try:
                moved = n.target(masks[0], *args[1:], **n.kwargs)
            except (RuntimeError, TypeError):
                return None
            return Slack(mask=moved, tol=sources[0].tol)
        if name in LOGICAL:
            merged = masks[0]
            for m in masks[1:]:
                merged = merged | m
            return Slack(mask=merged.expand(result.shape), tol=sources[0].tol)
        return None

    def _arg_slack(self, n: fx.Node, name: str, args: list[Any]) -> Slack | None:
        x = args[0]
        tol = _float_tol(x, self.tolerance)
        if tol is None:
            return None
        if name.endswith("_with_indices"):
            return Slack(arg=ArgSlack(x, -1, 3 if "3d" in name else 2, True), tol=tol)
        dim = args[1] if len(args) > 1 else n.kwargs.get("dim")
        keepdim = bool(args[2] if len(args) > 2 else n.kwargs.get("keepdim", False))
        if dim is None:  # argmax over everything: one index into the flattened tensor
            return Slack(arg=ArgSlack(x, -1, x.dim() or 1, True), tol=tol)
        return Slack(arg=ArgSlack(x, dim, 0, keepdim), tol=tol)


def _may_need(gm: fx.GraphModule) -> bool:
    """Whether any op of the graph can produce an exact value with slack."""
    names = {_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    return bool(names & (COMPARISONS | set(ARG_OPS)))


def exact_output_slack(module: Any, inputs: list[Any],
                       tolerance: Callable[[torch.dtype], tuple[float, float, float]]
                       ) -> dict[int, Slack]:
    """Output position -> slack, for the exact outputs of an aten GraphModule that come from
    float comparisons or arg-max/min. Runs the graph once more (values freed as it goes)."""
    if not isinstance(module, fx.GraphModule) or not _may_need(module):
        return {}
    recorder = _SlackRecorder(module, tolerance)
    with torch.no_grad():
        recorder.run(*inputs)
    out_node = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    flat, _ = torch.utils._pytree.tree_flatten(out_node.args[0])
    return {i: recorder.slack[node] for i, node in enumerate(flat)
            if isinstance(node, fx.Node) and node in recorder.slack}
