"""A reduction kernel loads a value that is one per row (a LayerNorm backward's mean and
rstd) once a row, under the row mask, instead of once a lane under the block's mask
(`Writer.row_masks`): with the block's mask every lane of a row loaded it again, 32 scalar
16-bit loads a thread in ViT-B/16's LayerNorm backward for sm_90."""

from __future__ import annotations

import re

import pytest
import torch

import compiler
from tests.compiler.oputil import (
    assert_matches,
    layer_norm_backward,
    layer_norm_backward_inputs,
    trace,
)


def _row_kernel(built: compiler.Built) -> str:
    """The source of the kernel that computes the input's gradient (rows of `width`)."""
    sources = [k.source for k in built.kernels if "rowmask" in k.source and "xindex * 768" in k.source]
    assert len(sources) == 1, [k.name for k in built.kernels]
    return sources[0]


def test_vit_sizedlayer_norm_backward_loads_mean_and_rstd_once_a_row() -> None:
    inputs = layer_norm_backward_inputs((32 * 197, 768))  # ViT-B/16 at batch 32: 6304 rows of 768
    gm = trace(layer_norm_backward, *inputs)
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    built = compiler.build(gm, compiler.heuristic_schedule(gm, target, inputs), inputs)
    source = _row_kernel(built)
    row_loads = re.findall(r"tl\.load\(\w+ \+ xindex, (\w+)", source)
    assert row_loads == ["xmask", "xmask"], source  # mean and rstd
    # the row's elements still load under the block's mask
    assert re.search(r"tl\.load\(\w+ \+ \(xindex \* 768 \+ rindex\), rowmask", source)


@pytest.mark.parametrize(("rows", "width"), [(37, 96), (8, 130)])
def test_the_gradients_match_eager(rows: int, width: int) -> None:
    inputs = layer_norm_backward_inputs((rows, width), torch.float32)  # ATen's CPU kernel: one dtype throughout
    gm = trace(layer_norm_backward, *inputs)
    built = compiler.build(gm, compiler.heuristic_schedule(gm, None, inputs), inputs)
    assert any("xmask, other=0" in k.source and "rowmask" in k.source for k in built.kernels)
    assert_matches(built(*inputs), layer_norm_backward(*inputs))
