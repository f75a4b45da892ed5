"""Op matrix: mm / addmm / bmm through the Triton template (and the ATen variant)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import compiler
from tests.compiler.oputil import TOL, assert_matches, check, rand, strided, trace

MM_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear_gelu_epilogue_ragged(dtype: torch.dtype) -> None:
    x, w, b = rand((33, 45), dtype, seed=1), rand((17, 45), dtype, seed=2), rand((17,), dtype, seed=3)
    built = check(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b, tol=MM_TOL[dtype])
    assert [k.kind for k in built.kernels] == ["matmul"]


def test_mm_transposed_and_offset_inputs() -> None:
    a, b = strided((19, 24), seed=4), strided((24, 21), seed=5)
    check(lambda a, b: torch.mm(a, b) * 2 + 1, a, b, tol=MM_TOL[torch.float32])


def test_addmm_alpha_beta_and_residual() -> None:
    def fn(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, a, b, beta=0.5, alpha=2.0) + r

    check(fn, rand((1, 20), seed=6), rand((18, 16), seed=7), rand((16, 20), seed=8),
          rand((18, 20), seed=9), tol=MM_TOL[torch.float32])


def test_bmm_with_epilogue() -> None:
    check(lambda a, b: torch.relu(torch.bmm(a, b)), rand((3, 17, 20), seed=10),
          rand((3, 20, 18), seed=11), tol=MM_TOL[torch.float32])


@pytest.mark.parametrize("shape", [(0, 8, 16), (16, 0, 16), (16, 8, 0), (1, 1, 1)])
def test_degenerate_sizes(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    check(lambda a, b: torch.mm(a, b) + 1, rand((m, k), seed=12), rand((k, n), seed=13))


def test_aten_variant_matches_and_is_reported() -> None:
    x, w, b = rand((20, 24), seed=14), rand((12, 24), seed=15), rand((12,), seed=16)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.linear(x, w, b))

    gm = trace(fn, x, w, b)
    s = compiler.heuristic_schedule(gm, None, [x, w, b])
    k = s.kernels[0]
    built = compiler.build(gm, s.with_kernel(k.name, variant="aten"), [x, w, b])
    built.poison = True
    assert_matches(built(x, w, b), fn(x, w, b), TOL[torch.float32])
    assert built.fallback_ops == ["aten.addmm.default"]
    (call,) = built.kernel_calls(x, w, b)
    call.launch()  # the ATen call and its epilogue again, on buffers the call keeps
    assert built.kernels[0].source != compiler.build(gm, s, [x, w, b]).kernels[0].source


def test_int_matmul_stays_aten() -> None:
    a = rand((4, 5), torch.int64, low=-3, high=3, seed=17)
    built = check(lambda a: torch.mm(a, a.t()), a, lowered=False)
    assert built.fallback_ops == ["aten.mm.default"]
