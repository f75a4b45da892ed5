"""Access patterns: where a kernel reads each value, from the op rules' metadata alone.

Every op rule computed at an index declares `reads(node, index)`: the index at which its
value there reads each input, with the emitter's own index arithmetic (`rules.py`). From
it come the access pattern of each input (`patterns`) and the one question fusion asks
of a kernel before it takes a node (`Reads.at_own_index`): does computing the node read
each of the kernel's anchors (a reduction's result, a matmul's accumulator) only at the
index where the kernel computes it? An anchor is a variable of the kernel valid at its
own index alone, so any other read makes the kernel impossible to write. The question is
answered by following indices through views, lazy values and members, as the Writer
would, without writing anything.

| pattern | the input is read at |
|---|---|
| same | the node's own index |
| broadcast | the node's index with dims dropped or pinned to 0 (right-aligned broadcast) |
| reindexed | another arrangement of the node's index (a view, a shift, a flip) |
| gathered | a position loaded from another tensor (gather, embedding, index) |
| row-reduced | every element of a row (a reduction's source, a matmul's operands) |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import fx

from compiler.codegen import matmul, rules
from compiler.codegen.common import Index, broadcast_index, dim_names, is_gathered
from compiler.codegen.reduction import reduction_info
from compiler.ir import Domain, KernelGroup, base_name, meta

SAME, BROADCAST, REINDEXED, GATHERED, ROW_REDUCED = (
    "same", "broadcast", "reindexed", "gathered", "row-reduced")


def input_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    """Where the value of `node` (a view, or an op computed at an index) at `idx` reads
    each of its inputs."""
    rule = rules.rule_of(node)
    reads = None if rule is None else rule.reads
    if reads is None:
        raise ValueError(f"{node.name}: {base_name(node)} is not computed at an index")
    return reads(node, idx)


def patterns(node: fx.Node) -> list[tuple[fx.Node, str]]:
    """The access pattern of each input `node` reads (see the module's table)."""
    kind = rules.rule_of(node).kind  # type: ignore[union-attr]
    if kind == "reduction":
        return [(reduction_info(node).source, ROW_REDUCED)]
    shape = meta(node).shape
    idx = dim_names("i", shape, "i") if shape else ()
    if kind == "matmul":
        bias, a, b, _, _ = matmul.operands(node)
        found = [] if bias is None else [
            (bias, _pattern(node, idx, bias, broadcast_index(idx, shape, meta(bias).shape)))]
        return [*found, (a, ROW_REDUCED), (b, ROW_REDUCED)]
    return [(arg, _pattern(node, idx, arg, at)) for arg, at in input_reads(node, idx)]


def _pattern(node: fx.Node, idx: Index, arg: fx.Node, at: Index) -> str:
    if any(is_gathered(e) for e in at):
        return GATHERED
    if at == idx and meta(arg).shape == meta(node).shape:
        return SAME
    lead = len(idx) - len(at)
    if lead >= 0 and all(e in ("0", idx[lead + d]) for d, e in enumerate(at)):
        return BROADCAST
    return REINDEXED


@dataclass
class Checks:
    """What fusion's checks cost (checks made, and the members of the kernels they asked
    about), and what they found. `verified` holds, per kernel and domain, the (node, index)
    pairs whose reads were followed to the end and found right: a later check of the same
    kernel stops at them. That holds while the plan's round lasts (the planner clears it
    with `new_round`): nodes join in graph order, so no later member or anchor is read by
    a node checked before it, and a value realized later only ends a walk sooner."""

    checks: int = 0
    members: int = 0
    verified: dict[tuple[str, Domain], set[tuple[fx.Node, Index]]] = field(default_factory=dict)

    def new_round(self) -> None:
        self.verified.clear()


@dataclass
class Reads:
    """What a kernel kind may ask about a node that would join a kernel, while fusion plans:
    `is_buffer` (a value in memory: a graph input, an ATen call's result, a member of
    some kernel), `deps` (the buffers computing the node reads, through lazy values), and
    the node's `kind` (`rules.NodeKind`: whether it anchors a kernel of its own)."""

    is_buffer: Callable[[fx.Node], bool]
    deps: frozenset[fx.Node]
    kind: rules.NodeKind
    checks: Checks = field(default_factory=Checks)

    def at_own_index(self, group: KernelGroup, start: fx.Node, idx: Index, anchors: set[fx.Node],
                     natural: Callable[[fx.Node], Index]) -> bool:
        """Whether computing `start` at `idx` in `group` reads each of `anchors` only at
        its own index (`natural(anchor)`, where the kernel sets its value): follows the
        reads through views, lazy values and members (not through other buffers, which
        are loaded at any index). Counted in `checks`."""
        members = set(group.members)
        self.checks.checks += 1
        self.checks.members += len(members)
        verified = self.checks.verified.setdefault((group.name, group.domain), set())
        seen: set[tuple[fx.Node, Index]] = set()
        todo = [(start, idx)]
        while todo:
            n, at = todo.pop()
            if (n, at) in seen or (n, at) in verified:
                continue
            seen.add((n, at))
            if n in anchors:
                if at != natural(n):
                    return False
                continue
            if self.is_buffer(n) and n not in members:
                continue
            todo.extend(input_reads(n, at))
        verified |= seen
        return True
