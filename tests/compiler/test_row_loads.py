"""A reduction kernel loads a value that is one per row (a LayerNorm backward's mean and
rstd) once a row, under the row mask, instead of once a lane under the block's mask
(`Writer.row_masks`): with the block's mask every lane of a row loaded it again, 32 scalar
16-bit loads a thread in ViT-B/16's LayerNorm backward for sm_90."""

from __future__ import annotations

import re

import pytest
import torch

import compiler
from tests.compiler.oputil import assert_matches, rand, trace

aten = torch.ops.aten


def _layer_norm_backward(grad, x, mean, rstd, w, b):  # noqa: ANN001, ANN202
    return aten.native_layer_norm_backward(grad, x, [x.shape[-1]], mean, rstd, w, b,
                                           [True, True, True])


def _inputs(rows: int, width: int, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """Gradient, input, its float32 mean and rstd (as a GPU's LayerNorm saves them for a
    bfloat16 input), weight and bias."""
    x = rand((rows, width), dtype, seed=1)
    mean = x.float().mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.float().var(-1, unbiased=False, keepdim=True) + 1e-5)
    return [rand((rows, width), dtype, seed=2), x, mean, rstd,
            rand((width,), dtype, seed=3), rand((width,), dtype, seed=4)]


def _row_kernel(built: compiler.Built) -> str:
    """The source of the kernel that computes the input's gradient (rows of `width`)."""
    sources = [k.source for k in built.kernels if "rowmask" in k.source and "xindex * 768" in k.source]
    assert len(sources) == 1, [k.name for k in built.kernels]
    return sources[0]


def test_vit_sized_layer_norm_backward_loads_mean_and_rstd_once_a_row() -> None:
    inputs = _inputs(32 * 197, 768)  # ViT-B/16 at batch 32: 6304 rows of 768
    gm = trace(_layer_norm_backward, *inputs)
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    built = compiler.build(gm, compiler.heuristic_schedule(gm, target, inputs), inputs)
    source = _row_kernel(built)
    row_loads = re.findall(r"tl\.load\(\w+ \+ xindex, (\w+)", source)
    assert row_loads == ["xmask", "xmask"], source  # mean and rstd
    # the row's elements still load under the block's mask
    assert re.search(r"tl\.load\(\w+ \+ \(xindex \* 768 \+ rindex\), rowmask", source)


@pytest.mark.parametrize(("rows", "width"), [(37, 96), (8, 130)])
def test_the_gradients_match_eager(rows: int, width: int) -> None:
    inputs = _inputs(rows, width, torch.float32)  # ATen's CPU kernel: one dtype throughout
    gm = trace(_layer_norm_backward, *inputs)
    built = compiler.build(gm, compiler.heuristic_schedule(gm, None, inputs), inputs)
    assert any("xmask, other=0" in k.source and "rowmask" in k.source for k in built.kernels)
    assert_matches(built(*inputs), _layer_norm_backward(*inputs))
