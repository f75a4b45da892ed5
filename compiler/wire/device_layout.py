"""Ops whose meta kernel does not give the layout the device's kernel gives.

Validation (`compiler.wire.fx`) and lowering (`compiler.lowering.lower`) run a graph's ops on
the meta device. For most ops that reproduces what AOTAutograd's fake tensors, which know
their device, recorded; a convolution does not: torch's meta kernel always answers
row-major, while cuDNN and oneDNN answer channels-last when the input's or the weight's
strides suggest it. A later view that is legal only in the device's layout (timm's ConvNeXt:
a depthwise convolution of a channels-last input, permuted to NHWC, viewed as rows for its
MLP) then failed validation, and kernels would read the convolution's result in the wrong
layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._prims_common import suggest_memory_format

aten = torch.ops.aten


def _convolution(x: torch.Tensor, weight: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The layout cuDNN's and oneDNN's convolutions give: channels-last when the input's or
    the weight's strides suggest it. A 1x1 weight is dense in both layouts; its strides
    decide, as in eager."""
    out = aten.convolution.default(x, weight, *args, **kwargs)
    if out.dim() == 4 and torch.channels_last in (suggest_memory_format(x),
                                                  suggest_memory_format(weight)):
        return out.contiguous(memory_format=torch.channels_last)
    return out


RULES: dict[Any, Callable[..., Any]] = {aten.convolution.default: _convolution}


def run(target: Any, *args: Any, **kwargs: Any) -> Any:
    """`target(*args, **kwargs)` on meta tensors, laid out as the device lays its result out."""
    return RULES.get(target, target)(*args, **kwargs)
