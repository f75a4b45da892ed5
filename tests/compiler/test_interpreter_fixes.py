"""The Triton interpreter's bf16 conversions round to nearest even, as the GPU and eager do."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the interpreter's behaviour: needs TRITON_INTERPRET=1")


def test_fp32_to_bf16_stores_round_like_torch() -> None:
    import triton
    import triton.language as tl

    from compiler.runtime.interpreter_fixes import patch_interpreter_bf16_dot

    patch_interpreter_bf16_dot()

    @triton.jit
    def narrow(x, y, n: tl.constexpr):
        offsets = tl.arange(0, n)
        tl.store(y + offsets, tl.load(x + offsets).to(tl.bfloat16))

    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 100
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.3e38])
    y = torch.empty(4096, dtype=torch.bfloat16)
    narrow[(1,)](x, y, 4096)
    assert torch.isnan(y[0])
    assert torch.equal(y[1:], x[1:].to(torch.bfloat16))  # truncation would miss about half
