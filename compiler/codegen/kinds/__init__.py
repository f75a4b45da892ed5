"""The registry of kernel kinds: one module per kind, each owning its variants, config
keys and validation, heuristic, tuning space and pruning, launch grid and generator.

| kind | group kind | variants | module |
|---|---|---|---|
| pointwise | pointwise | pointwise | `pointwise.py` |
| reduction | reduction | see `reduction.py`'s docstring | `reduction.py` |
| aten_act (an addmm and its ReLU or tanh-GELU as one library call) | matmul | aten_act | `aten_activation.py` |
| aten (an ATen call, the epilogue a kernel) | matmul | aten | `aten.py` |
| matmul (the Triton template) | matmul | triton | `matmul.py` |

Variant names are unique across kinds, so a variant names its kind. The order of `KINDS`
is the order the heuristic asks the kinds serving a group (an ATen call claims only the
matmuls it beats the template on) and the order ties break in (`variant_order`). Lookups
read the kinds' variants each time, so a variant is one entry in its kind's module.

Fusion asks the registry, never a kind by name: the kernel a node starts (`start`),
whether it may join one at all (`joins`), whether it joins siblings (`joins_siblings`) or
kernels it reads nothing of (`joins_alongside`),
and the kernel a join makes (`fuse`), which every kind serving it must accept.
"""

from __future__ import annotations

from torch import fx

from compiler.codegen.access import Reads
from compiler.codegen.kinds import aten, aten_activation, matmul, pointwise, reduction
from compiler.codegen.kinds.base import Config, KernelKind, Point
from compiler.codegen.rules import NodeKind
from compiler.ir import KINDS as GROUP_KINDS
from compiler.ir import KernelGroup

KINDS: tuple[KernelKind, ...] = (pointwise.KIND, reduction.KIND, aten_activation.KIND, aten.KIND,
                                  matmul.KIND)


def _check_registry() -> None:
    names = [v for kind in KINDS for v in kind.variants]
    if len(set(names)) != len(names):
        raise RuntimeError(f"kernel kinds' variant names must be unique: {names}")
    if {k.group_kind for k in KINDS} != set(GROUP_KINDS):
        raise RuntimeError("every group kind (compiler.ir.KINDS) needs a kernel kind")
    if sum(k.anchor_op is None for k in KINDS) != 1:
        raise RuntimeError("exactly one kernel kind takes the values no anchor starts")
    for op in {k.anchor_op for k in KINDS}:
        if len({k.group_kind for k in KINDS if k.anchor_op == op}) != 1:
            raise RuntimeError(f"the nodes of {op!r} must start kernels of one group kind")


_check_registry()


def kinds_for(group_kind: str) -> tuple[KernelKind, ...]:
    """The kinds that can compute a group of `group_kind`, in registry order."""
    return tuple(k for k in KINDS if k.group_kind == group_kind)


def variants_of(group_kind: str) -> tuple[str, ...]:
    """Every variant a schedule may give a group of `group_kind`."""
    return tuple(v for k in kinds_for(group_kind) for v in k.variants)


def kind_of(group_kind: str, variant: str) -> KernelKind:
    """The kind that computes `variant` of a `group_kind` group; ValueError if none does."""
    kind = kind_of_variant(variant)
    if kind is None or kind.group_kind != group_kind:
        raise ValueError(f"variant {variant!r} is not one of {variants_of(group_kind)}")
    return kind


def kind_of_variant(variant: str) -> KernelKind | None:
    """The kind a variant name belongs to (None: no kind has it)."""
    return next((k for k in KINDS if variant in k.variants), None)


def variant_order() -> tuple[str, ...]:
    """Every variant in tie-break order (tuner.records): kinds in registry order, each
    kind's variants in its tie order."""
    return tuple(v for kind in KINDS for v in kind.tie_order)


def heuristic(group: KernelGroup, gpu: bool, arch: str = "") -> Point:
    """Heuristic (variant, config) of one kernel on a GPU of class `arch` (or the CPU): the
    first kind serving its group kind that claims it."""
    for kind in kinds_for(group.kind):
        point = kind.heuristic(group, gpu, arch)
        if point is not None:
            return point
    raise ValueError(f"kernel {group.name}: no kind claims a {group.kind!r} group")


def _starting(node_kind: NodeKind) -> KernelKind:
    """The kind whose kernel a node of `node_kind` starts (the first in registry order)."""
    name = node_kind.name if node_kind.anchor else None
    return next(k for k in KINDS if k.anchor_op == name)


def start(node: fx.Node, node_kind: NodeKind, name: str, position: int) -> KernelGroup:
    """The kernel `node` (realized, of `node_kind`) starts at step `position`."""
    return _starting(node_kind).start(node, name, position)


def joins(node_kind: NodeKind) -> bool:
    """Whether a node of `node_kind` may join an earlier kernel (else it starts its own)."""
    return _starting(node_kind).anchor_joins


def joins_siblings(node_kind: NodeKind, group: KernelGroup) -> bool:
    """Whether a node of `node_kind` is related to `group` when both read the same
    producers' values (reductions of one tensor share a pass over it)."""
    kind = _starting(node_kind)
    return node_kind.anchor and kind.siblings and group.kind == kind.group_kind


def joins_alongside(node_kind: NodeKind, group: KernelGroup, node: fx.Node) -> bool:
    """Whether anchor `node` is related to `group` though they read nothing in common
    (`KernelKind.alongside`: the first stages of split reductions of one domain)."""
    kind = _starting(node_kind)
    return node_kind.anchor and group.kind == kind.group_kind and kind.alongside(group, node)


def fuse(group: KernelGroup, node: fx.Node, reads: Reads) -> KernelGroup | None:
    """`group` with `node` added (a new group: `group` is left as it was), or None when
    it cannot take it: the shapes, from the kind that `node` anchors or else the kind
    serving `group`, then every kind that would serve the grown group."""
    deciding = _starting(reads.kind) if reads.kind.anchor else kinds_for(group.kind)[0]
    joined = deciding.joined(group, node, reads)
    if joined is None:
        return None
    kind, domain = joined
    grown = KernelGroup(group.name, kind, domain, group.members + [node], group.position,
                        anchors=group.anchors + ([node] if reads.kind.anchor else []),
                        dtype=group.dtype)
    grown.stored = list(grown.members)
    return grown if all(k.can_fuse(grown, node, reads) for k in kinds_for(kind)) else None


__all__ = ["KINDS", "Config", "KernelKind", "Point", "fuse", "heuristic", "joins", "joins_alongside",
           "joins_siblings", "kind_of", "kind_of_variant", "kinds_for", "start", "variant_order",
           "variants_of"]
