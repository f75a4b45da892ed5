"""On a CUDA device: generated kernels compile and match eager, also under CUDA graph replay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import compiler
from tests.compiler.oputil import assert_matches, trace

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CASES = {
    "layer_norm_gelu": (lambda x, w, b: F.gelu(F.layer_norm(x, (1000,), w, b)) + x,
                        lambda: [torch.randn(64, 1000), torch.randn(1000), torch.randn(1000)],
                        (2e-5, 2e-5)),
    "softmax_wide": (lambda x: torch.softmax(x * 0.125, -1), lambda: [torch.randn(8, 20000)],
                     (1e-6, 1e-5)),
    "cross_entropy_bf16": (lambda x, y: F.cross_entropy(x, y),
                           lambda: [torch.randn(64, 5000).bfloat16(), torch.randint(0, 5000, (64,))],
                           (2e-2, 2e-2)),
    "linear_gelu_bf16": (lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
                         lambda: [torch.randn(300, 256).bfloat16(), torch.randn(200, 256).bfloat16(),
                                  torch.randn(200).bfloat16()], (5e-2, 5e-2)),
    "bias_grad": (lambda g: (g.sum(0), g.t().contiguous()), lambda: [torch.randn(4000, 96)],
                  (1e-4, 1e-4)),
    # an inference block: its convolutions run channels-last (KILN_CHANNELS_LAST=auto) on
    # cuDNN, with NHWC pointwise kernels and a row-major 1x1 weight (compiler/lowering/layout.py)
    "conv_block_nhwc_bf16": (
        lambda x, w1, w2, scale, shift: (torch.relu(
            F.conv2d(x, w1, padding=1) * scale[:, None, None] + shift[:, None, None])
            + F.conv2d(x, w2)).mean((2, 3)),
        lambda: [torch.randn(8, 16, 14, 13).bfloat16(), torch.randn(32, 16, 3, 3).bfloat16(),
                 torch.randn(32, 16, 1, 1).bfloat16(), torch.rand(32).bfloat16() + 0.5,
                 torch.randn(32).bfloat16()], (5e-2, 5e-2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_case(name: str) -> None:
    fn, make, tol = CASES[name]
    torch.manual_seed(0)
    inputs = [t.cuda() for t in make()]
    gm = trace(fn, *inputs)
    target = compiler.Target.detect("cuda")
    built = compiler.build(gm, compiler.heuristic_schedule(gm, target, inputs), inputs)
    built.poison = True
    want = fn(*inputs)
    for _ in range(3):  # plain launches, then CUDA graph capture, then replay
        assert_matches(built(*inputs), want, tol)
    other = [t.clone() for t in inputs]
    other[0].mul_(0.5)  # a moved, changed input: copied into the graph's buffer
    assert_matches(built(*other), fn(*other), tol)


def test_precompile_loads_every_kernel_so_the_first_call_compiles_nothing() -> None:
    fn, make, tol = CASES["layer_norm_gelu"]
    inputs = [t.cuda() for t in make()]
    gm = trace(fn, *inputs)
    built = compiler.build(gm, None, inputs)
    launches = built.launches()
    assert built.precompile("cuda") == len(launches) > 0
    device = torch.cuda.current_device()

    def cached() -> int:
        return sum(len(info.fn.device_caches[device][0]) for info in launches)

    before = cached()
    assert before >= len(launches)
    assert_matches(built(*inputs), fn(*inputs), tol)
    assert cached() == before  # the call found every kernel compiled and loaded
