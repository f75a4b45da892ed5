"""Reductions over outer dims (column sums, channels-last statistics, split reductions'
first stages) on a GPU get tiles of about 512 elements (`kinds/reduction.py`,
`_outer_blocks`), at the sizes real models have; the interpreter keeps its wide blocks;
every such choice is a point of the tuner's space."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.codegen import kinds
from compiler.codegen.limits import gpu_limits
from compiler.lowering.frontend import lower_graph
from tests.compiler.oputil import (
    assert_matches,
    layer_norm_backward,
    layer_norm_backward_inputs,
    rand,
    trace,
)
from tuner.records import Candidate
from tuner.space import prune_reason, raw_space


def _batch_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, None, None, w, b, training=True)


def _outer_groups(fn, *inputs):  # noqa: ANN001, ANN202
    program, _ = lower_graph(trace(fn, *inputs), list(inputs))
    return [g for g in program.kernels if g.kind == "reduction" and not g.domain.inner]


def _gpt2_layer_norm():  # noqa: ANN202 - GPT-2 at batch 8 x 512: 4096 rows of 768
    return _outer_groups(layer_norm_backward, *layer_norm_backward_inputs((4096, 768)))


def _vit_layer_norm():  # noqa: ANN202 - ViT-B/16 at batch 32: 6304 rows of 768
    return _outer_groups(layer_norm_backward, *layer_norm_backward_inputs((6304, 768)))


def _bias_gradient():  # noqa: ANN202 - a linear layer's bias gradient, 8192 tokens of 4096
    return _outer_groups(lambda g: g.sum(0), rand((8192, 4096), torch.bfloat16))


def _resnet_batch_norm():  # noqa: ANN202 - resnet18's first BatchNorm, channels-last
    x = rand((32, 64, 56, 56), torch.bfloat16).contiguous(memory_format=torch.channels_last)
    return _outer_groups(_batch_norm, x, rand((64,), torch.bfloat16), rand((64,), torch.bfloat16))


CASES = {"gpt2 layer norm": _gpt2_layer_norm, "vit layer norm": _vit_layer_norm,
         "bias gradient": _bias_gradient, "resnet batch norm": _resnet_batch_norm}


def test_a_layer_norms_column_sums_take_16_by_32_tiles_on_a_gpu() -> None:
    """The first stage of GPT-2's LayerNorm weight and bias gradients (32 chunks of 128 rows
    of 768 columns): 64x64 tiles held 226 registers a thread for sm_90, 16x32 ones 56."""
    first, second = _gpt2_layer_norm()
    assert (first.domain.xnumel, first.domain.rnumel) == (24576, 128)
    assert kinds.heuristic(first, True, "sm_90") == (
        "looped", {"XBLOCK": 16, "RBLOCK": 32, "num_warps": 4, "num_stages": 1})
    # the second stage sums 32 partials of 768 columns: one pass, 96 programs
    assert kinds.heuristic(second, True, "sm_90") == (
        "persistent", {"XBLOCK": 8, "RBLOCK": 32, "num_warps": 2, "num_stages": 1})


def test_wide_outer_reductions_take_short_wide_tiles() -> None:
    (first, _) = _bias_gradient()
    assert first.domain.xnumel == 131072
    variant, config = kinds.heuristic(first, True, "sm_90")
    assert (config["XBLOCK"], config["RBLOCK"], config["num_warps"]) == (64, 8, 4)


def test_the_interpreter_keeps_wide_blocks() -> None:
    first, _ = _gpt2_layer_norm()
    assert kinds.heuristic(first, False) == (
        "looped", {"XBLOCK": 64, "RBLOCK": 64, "num_warps": 1, "num_stages": 1})


@pytest.mark.parametrize("case", list(CASES))
def test_the_tuners_space_holds_every_outer_config_the_heuristic_picks(case: str) -> None:
    limits = gpu_limits("sm_90")
    for group in CASES[case]():
        variant, config = kinds.heuristic(group, True, "sm_90")
        kernel = {"name": group.name, "kind": "reduction", "variant": variant,
                  "sizes": group.sizes, "dtype": "bfloat16", "config": config}
        space = {Candidate.of_kernel({**kernel, "variant": v, "config": c})
                 for v, c in raw_space(kernel)
                 if prune_reason("reduction", v, c, group.sizes, "bfloat16", limits) is None}
        assert Candidate.of_kernel(kernel) in space, f"{case} {group.name}: {variant} {config}"


def test_gpu_tiles_compute_the_same_gradients() -> None:
    """The GPU's schedule run on the interpreter at an odd size (37 rows of 96)."""
    inputs = layer_norm_backward_inputs((37, 96), torch.float32)
    gm = trace(layer_norm_backward, *inputs)
    schedule = compiler.heuristic_schedule(gm, compiler.Target.named("sm_90", name="NVIDIA H200"),
                                           inputs)
    outer = [k for k in schedule.kernels if k.kind == "reduction" and k.config["XBLOCK"] < 64]
    assert outer, [k.config for k in schedule.kernels]
    built = compiler.build(gm, schedule, inputs)
    assert_matches(built(*inputs), layer_norm_backward(*inputs))
