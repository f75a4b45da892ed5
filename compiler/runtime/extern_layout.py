"""ATen calls' results in the layout the graph was lowered for.

Kernels read an ATen call's result (a convolution's, a matmul's) with the strides that
metadata propagation predicted for it, written into their source. The library decides the
real layout, and on some devices it decides from other arguments than the meta kernel
does: cuDNN's convolution backward lays the input's gradient out like `grad_output`
(and the weight), while the meta kernel, like the CPU's oneDNN path, follows the input.
A channels-last input with a row-major `grad_output` (timm's ConvNeXt on an H200) then
gave a row-major gradient that the next kernel read as channels-last: wrong numbers, no
error. So a result whose strides differ from the predicted ones (size-1 dims aside) is
copied into the predicted layout before anything reads it; results that already match
(every one on the CPU) cost a stride comparison.

Only ops that return fresh tensors are guarded: a view's result shares its base's memory,
so a copy would change what it aliases.
"""

from __future__ import annotations

from typing import Any

import torch

from compiler.ir import TensorMeta, strides_match


def returns_fresh(target: Any) -> bool:
    """An ATen op none of whose results alias an argument (not a view, not in-place)."""
    schema = getattr(target, "_schema", None)
    if not isinstance(target, torch._ops.OpOverload) or schema is None:
        return False
    return all(r.alias_info is None for r in schema.returns)


def layouts(meta: Any) -> Any:
    """The (shape, strides) a result must have, in the result's structure (None where any
    layout will do), or None when nothing in it is a tensor."""
    if isinstance(meta, TensorMeta):
        return (meta.shape, meta.stride)
    if isinstance(meta, (tuple, list)):
        inner = tuple(layouts(m) for m in meta)
        return inner if any(i is not None for i in inner) else None
    return None


def laid_out(value: Any, want: Any) -> Any:
    """`value` (a tensor, or a tuple or list of them) with the strides `want` gives: itself
    where they agree, else a copy in that layout."""
    if want is None:
        return value
    if isinstance(value, torch.Tensor):
        shape, stride = want
        have = value.stride()
        if have == stride or tuple(value.shape) != shape or strides_match(shape, have, stride):
            return value
        return torch.empty_strided(shape, stride, dtype=value.dtype,
                                   device=value.device).copy_(value)
    if isinstance(value, (tuple, list)) and len(value) == len(want):
        fixed = [laid_out(v, w) for v, w in zip(value, want, strict=True)]
        return type(value)(fixed) if isinstance(value, list) else tuple(fixed)
    return value
