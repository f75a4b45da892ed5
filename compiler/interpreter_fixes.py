"""A fix for the Triton interpreter (CPU runs only; generated sources are untouched).

Triton 3.9's interpreter stores bfloat16 as uint16 and multiplies those integers in
`tl.dot`, so a bf16 matmul gives garbage on the CPU. Widen bf16 operands to fp32 first,
which is what the GPU's tensor cores compute (bf16 products, fp32 accumulation).
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
    log.debug("patched the Triton interpreter's bf16 dot")
