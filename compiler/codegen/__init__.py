"""Triton source generation for kiln's kernel groups (see `generate_kernel`); each kernel
kind's generator is in `compiler.codegen.kinds`."""

from __future__ import annotations

from collections.abc import Callable

from torch import fx

from compiler.codegen import kinds
from compiler.codegen.common import NotFusible, Unsupported
from compiler.codegen.writer import Generated, index_bits
from compiler.ir import KernelGroup, TensorMeta, meta

__all__ = ["Generated", "NotFusible", "Unsupported", "generate_kernel"]


def generate_kernel(group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                    comment: list[str]) -> Generated:
    """The Triton module for `group` in `variant`; 64-bit indexing only where sizes need it."""
    kind = kinds.kind_of(group.kind, variant)
    for int64 in (False, True):
        gen = kind.generate(group, variant, is_buffer, comment, int64)
        if int64 or not _needs_int64(kind.elements(group), gen):
            return gen
    raise AssertionError("unreachable")


def _needs_int64(elements: int, gen: Generated) -> bool:
    metas: list[TensorMeta] = [meta(n) for n in gen.inputs + gen.outputs]
    return elements > 2**31 - 1 or index_bits(metas)
