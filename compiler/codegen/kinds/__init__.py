"""The registry of kernel kinds: one module per kind, each owning its variants, config
keys and validation, heuristic, tuning space and pruning, launch grid and generator.

| kind | group kind | variants | module |
|---|---|---|---|
| pointwise | pointwise | pointwise | `pointwise.py` |
| reduction | reduction | see `reduction.py`'s docstring | `reduction.py` |
| aten (an ATen call, the epilogue a kernel) | matmul | aten | `aten.py` |
| matmul (the Triton template) | matmul | triton | `matmul.py` |

Variant names are unique across kinds, so a variant names its kind. The order of `KINDS`
is the order the heuristic asks the kinds serving a group (an ATen call claims only the
matmuls it beats the template on) and the order ties break in (`variant_order`). Lookups
read the kinds' variants each time, so a variant is one entry in its kind's module.
"""

from __future__ import annotations

from compiler.codegen.kinds import aten, matmul, pointwise, reduction
from compiler.codegen.kinds.base import Config, KernelKind, Point
from compiler.ir import KINDS as GROUP_KINDS
from compiler.ir import KernelGroup

KINDS: tuple[KernelKind, ...] = (pointwise.KIND, reduction.KIND, aten.KIND, matmul.KIND)


def _check_registry() -> None:
    names = [v for kind in KINDS for v in kind.variants]
    if len(set(names)) != len(names):
        raise RuntimeError(f"kernel kinds' variant names must be unique: {names}")
    if {k.group_kind for k in KINDS} != set(GROUP_KINDS):
        raise RuntimeError("every group kind (compiler.ir.KINDS) needs a kernel kind")


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


def trial_variant(group_kind: str) -> str:
    """The variant fusion generates to test whether a group may take another node."""
    return next(k.trial_variant for k in kinds_for(group_kind) if k.trial_variant is not None)


__all__ = ["KINDS", "Config", "KernelKind", "Point", "heuristic", "kind_of", "kind_of_variant",
           "kinds_for", "trial_variant", "variant_order", "variants_of"]
