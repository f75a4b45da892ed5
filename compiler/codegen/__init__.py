"""Triton source generation for kiln's kernel groups (see `generate_kernel`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import fx

from compiler.codegen import matmul, pointwise, reduction, rules
from compiler.codegen.common import NotFusible, Unsupported
from compiler.codegen.writer import Generated, Writer, index_bits
from compiler.ir import KernelGroup, TensorMeta, meta

__all__ = ["Generated", "NotFusible", "Unsupported", "generate_kernel"]


def generate_kernel(group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                    comment: list[str]) -> Generated:
    """The Triton module for `group` in `variant`; 64-bit indexing only where sizes need it."""
    for int64 in (False, True):
        members = set(group.members)
        buffer = is_buffer
        if group.kind == "matmul" and variant == "aten":
            mm = group.anchors[0]
            members.discard(mm)

            def buffer(n: fx.Node, _mm: fx.Node = mm) -> bool:
                return n is _mm or is_buffer(n)

        w = Writer(members=members, is_buffer=buffer, int64=int64, evaluate=rules.evaluate)
        if group.kind == "pointwise":
            gen = pointwise.generate(group, w, comment)
        elif group.kind == "reduction":
            gen = reduction.generate(group, w, comment, variant, is_buffer)
        else:
            gen = matmul.generate(group, w, comment, variant)
        if int64 or not _needs_int64(group, gen):
            return gen
    raise AssertionError("unreachable")


def _needs_int64(group: KernelGroup, gen: Generated) -> bool:
    metas: list[TensorMeta] = [meta(n) for n in gen.inputs + gen.outputs]
    d = group.domain
    total = d.xnumel * max(d.rnumel, 1)
    if group.kind == "matmul":
        total = max(total, d.shape[-2] * max(d.k, 1), d.k * d.shape[-1])
    return total > 2**31 - 1 or index_bits(metas)
