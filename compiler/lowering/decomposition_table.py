"""kiln's decomposition table for AOTAutograd and make_fx.

Start from PyTorch's core-ATen set, then break the composite normalisation, softmax,
activation and loss ops that core ATen keeps whole into pointwise ops and reductions the
compiler can fuse, and keep whole the ops that are better run as library calls (matmuls,
convolutions, attention, embedding backward). Max, average and adaptive average pooling
and their backwards are core ATen ops and stay whole: the compiler computes them
(`compiler/codegen/pooling.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten

# Ops that core ATen keeps whole but that kiln wants as pointwise + reductions.
_BREAK_UP = (
    "native_layer_norm",
    "native_layer_norm_backward",
    "_softmax",
    "_log_softmax",
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "gelu",
    "gelu_backward",
    "native_batch_norm",
    "native_batch_norm_backward",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional",
    "nll_loss_forward",
    "nll_loss_backward",
    "nll_loss2d_forward",
    "nll_loss2d_backward",
)

# Ops that stay single ATen calls: matmuls and convolutions go to cuBLAS/cuDNN or a matmul
# template, attention to its fused kernel, embedding backward to kiln's library call
# (`compiler/runtime/library_calls.py`: ATen's own kernel where that one does not apply).
_KEEP_WHOLE = (
    "mm",
    "addmm",
    "bmm",
    "convolution",
    "convolution_backward",
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward",
    "embedding_dense_backward",
)


def _packets(names: tuple[str, ...]) -> list[torch._ops.OpOverloadPacket]:
    """The packets of `names` that this torch build has (older builds lack a few)."""
    return [getattr(aten, name) for name in names if hasattr(aten, name)]


@functools.cache
def _table() -> dict[torch._ops.OpOverload, Callable]:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_packets(_BREAK_UP)))
    for packet in _packets(_KEEP_WHOLE):
        for overload_name in packet.overloads():
            table.pop(getattr(packet, overload_name), None)
    return table


def decompositions() -> dict[torch._ops.OpOverload, Callable]:
    """kiln's decomposition table (a fresh dict each call; callers may extend it)."""
    return dict(_table())

