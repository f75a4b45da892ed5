"""A convolution's bias is an add in the kernel that reads its result
(`compiler/lowering/conv_bias.py`): the ATen call runs without a bias, no kernel exists only
to add it, and the numbers are eager's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from compiler.ir import ExternStep
from tests.compiler.oputil import check, rand

aten = torch.ops.aten


def _convolutions(built) -> list[torch.fx.Node]:  # noqa: ANN001
    return [s.node for s in built.program.steps
            if isinstance(s, ExternStep) and s.node.target is aten.convolution.default]


def test_a_depthwise_convolutions_bias_joins_the_layer_norm_that_reads_it() -> None:
    """ConvNeXt's block: a channels-last depthwise convolution, permuted to NHWC, then a
    LayerNorm over channels: one ATen call and one kernel."""
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, w, b, padding=3, groups=x.shape[1]).permute(0, 2, 3, 1)
        return F.layer_norm(y, (y.shape[-1],), g, beta)

    c = 8
    x = rand((2, c, 9, 7), seed=1).to(memory_format=torch.channels_last)
    inputs = [x, rand((c, 1, 7, 7), seed=2), rand((c,), seed=3), rand((c,), seed=4),
              rand((c,), seed=5)]
    built = check(fn, *inputs, lowered=False)
    (conv,) = _convolutions(built)
    assert conv.args[2] is None, "the ATen call runs without its bias"
    (kernel,) = built.program.kernels
    assert kernel.stem.startswith("fused_convolution"), kernel.stem


def test_a_biased_convolution_that_is_an_output_adds_its_bias_in_a_kernel() -> None:
    """Nothing reads the result but the caller: the add is a kernel of its own, and
    transposed and 1-D convolutions broadcast their bias over their own rank."""
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, x1: torch.Tensor,
           w1: torch.Tensor, b1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.conv_transpose2d(x, w, b, stride=2), F.conv1d(x1, w1, b1, padding=1)

    inputs = [rand((2, 4, 5, 3), seed=6), rand((4, 3, 3, 3), seed=7), rand((3,), seed=8),
              rand((2, 4, 11), seed=9), rand((5, 4, 3), seed=10), rand((5,), seed=11)]
    built = check(fn, *inputs, lowered=False)
    assert all(conv.args[2] is None for conv in _convolutions(built))
    assert len(_convolutions(built)) == 2
    assert len(built.program.kernels) == 2


def test_a_convolution_without_bias_is_left_as_it_is() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(F.conv2d(x, w, padding=1))

    built = check(fn, rand((2, 3, 6, 5), seed=12), rand((4, 3, 3, 3), seed=13), lowered=False)
    (kernel,) = built.program.kernels
    assert "convolution" not in kernel.stem
