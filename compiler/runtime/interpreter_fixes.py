"""Fixes for the Triton interpreter's bfloat16 (CPU runs only; generated sources are untouched).

Triton 3.9's interpreter stores bfloat16 as uint16 and multiplies those integers in
`tl.dot`, so a bf16 matmul gives garbage on the CPU. Widen bf16 operands to fp32 first,
which is what the GPU's tensor cores compute (bf16 products, fp32 accumulation).

It also converts fp32 to bf16 by truncation, where the GPU (and eager) round to nearest
even: every bf16 store loses up to one unit toward zero, and through a block's chain of
stores the bias grows to several percent, so the interpreter check of a bf16 graph
failed on values the GPU computes right. Round to nearest even, as the GPU does.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)


@functools.cache
def patch_interpreter_bf16_dot() -> None:
    """Idempotently patch `InterpreterBuilder.create_dot` for bfloat16 operands."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # no interpreter in this Triton: nothing to fix
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "create_dot", None)
    if original is None or getattr(original, "_kiln_patched", False):
        return

    def widen(handle: object) -> object:
        if getattr(handle, "dtype", None) != tl.bfloat16:
            return handle
        data = handle.data.astype(np.uint32) << 16  # type: ignore[attr-defined]
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ANN001, ANN202
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._kiln_patched = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot
    _round_bf16_to_nearest(builder, interpreter, tl, np)
    log.debug("patched the Triton interpreter's bf16 dot and rounding")


def _round_bf16_to_nearest(builder, interpreter, tl, np) -> None:  # noqa: ANN001
    """fp32 -> bf16 casts round to nearest even (NaN stays NaN) instead of truncating."""
    cast, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def to_bf16(src):  # noqa: ANN001, ANN202
        bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
                   >> np.uint32(16)).astype(np.uint16)
        nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        out = np.where(nan, (bits >> np.uint32(16)).astype(np.uint16) | np.uint16(0x40), rounded)
        return interpreter.TensorHandle(out.astype(np.uint16), tl.bfloat16)

    def narrowing(src, dst_type) -> bool:  # noqa: ANN001
        return src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16

    def cast_impl(self, src, dst_type):  # noqa: ANN001, ANN202
        return to_bf16(src) if narrowing(src, dst_type) else cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):  # noqa: ANN001, ANN202
        if narrowing(src, dst_type) and rounding_mode is None:
            return to_bf16(src)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    builder.cast_impl = cast_impl
    builder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder.create_fp_to_fp = create_fp_to_fp
