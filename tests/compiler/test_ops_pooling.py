"""2-D pooling as Triton kernels (`compiler/codegen/pooling.py`): max pooling's values and
indices equal ATen's (ties, NaN, -inf, padding, dilation, ceil mode, both layouts), its
backward equals ATen's, a pooling fuses with its neighbours, a resnet-like stem trains as
eager; average and adaptive average pooling, both ways, as ATen's."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import compiler
from compiler.lowering.fusion import MAX_INLINED_LOADS
from tests.compiler.oputil import TOL, assert_matches, check, rand, trace

aten = torch.ops.aten
CL = torch.channels_last

# (kernel, stride, padding, dilation, ceil_mode): resnet's stem, a non-square window with
# stride 1 along one dim, dilation with padding, ceil mode's partial last window, and a
# 3x3 window with stride 3 whose last window sticks out of the input.
FORMS = [
    ([3, 3], [2, 2], [1, 1], [1, 1], False),
    ([2, 3], [1, 2], [1, 0], [1, 1], False),
    ([3, 3], [1, 1], [1, 1], [2, 2], False),
    ([3, 3], [2, 2], [0, 0], [1, 1], True),
    ([3, 3], [3, 3], [1, 1], [1, 1], True),
]


def _pool(form: tuple) -> object:
    return lambda x: aten.max_pool2d_with_indices(x, *form)


def _exact(got: tuple, want: tuple) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.isnan(), w.isnan()) if g.is_floating_point() else True
        torch.testing.assert_close(g, w, atol=0, rtol=0, equal_nan=True)


def _ties(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values from {-1, 0, 1}: most windows hold their maximum more than once."""
    return rand(shape, torch.int64, low=-1, high=2, seed=seed).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("form", FORMS, ids=[f"form{i}" for i in range(len(FORMS))])
def test_forward_values_and_indices_are_atens(form: tuple, layout: str, dtype: torch.dtype) -> None:
    x = rand((2, 3, 9, 10), dtype, seed=1)
    if layout == "channels_last":
        x = x.contiguous(memory_format=CL)
    built = check(_pool(form), x)
    assert len(built.kernels) == 1  # values and indices: one kernel
    _exact(built(x), _pool(form)(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_ties_nan_and_minus_inf_follow_aten(dtype: torch.dtype) -> None:
    """First maximum wins a tie, the last NaN wins a window holding NaNs, a window of -inf
    points at its first position inside the input."""
    x = _ties((2, 2, 8, 9), dtype, seed=2)
    x[0, 0, 1, 1] = x[0, 0, 4, 6] = x[1, 1, 4, 5] = float("nan")
    x[1, 0, :5, :5] = float("-inf")
    for form in FORMS:
        built = check(_pool(form), x)
        _exact(built(x), _pool(form)(x))


def test_a_three_d_input_pools_its_last_two_dims() -> None:
    x = _ties((3, 7, 8), torch.float32, seed=3)
    _exact(check(_pool(FORMS[0]), x)(x), _pool(FORMS[0])(x))


def _inlined_loads(form: tuple) -> int:
    """Loads per element of a backward that recomputes the forward's indices: candidate
    outputs times the window."""
    kernel, stride, _, dilation, _ = form
    candidates = math.prod((k - 1) * d // s + 1 for k, s, d in zip(kernel, stride, dilation, strict=True))
    return candidates * math.prod(kernel)


def test_a_backward_realizes_indices_whose_inlining_would_unroll_too_much() -> None:
    """A dilated 3x3 window at stride 1: 25 candidates of 9 loads were one 1,600-line
    kernel (ptxas took minutes on it for sm_90); the indices get a buffer instead."""
    assert _inlined_loads(FORMS[2]) > MAX_INLINED_LOADS >= _inlined_loads(FORMS[0])
    x = rand((2, 3, 9, 10), torch.bfloat16, seed=20)
    g = rand(tuple(_pool(FORMS[2])(x)[0].shape), torch.bfloat16, seed=21)
    built = check(_backward(FORMS[2]), g, x)
    assert [k.ops[0] for k in built.kernels] == ["aten.max_pool2d_with_indices.default",
                                                 "aten.max_pool2d_with_indices_backward.default"]
    assert max(len(k.source.splitlines()) for k in built.kernels) < 400


def _backward(form: tuple) -> object:
    def fn(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        _, indices = aten.max_pool2d_with_indices(x, *form)
        return aten.max_pool2d_with_indices_backward(g, x, *form, indices)
    return fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("form", FORMS, ids=[f"form{i}" for i in range(len(FORMS))])
def test_backward_is_atens(form: tuple, layout: str, dtype: torch.dtype) -> None:
    """Ties make overlapping windows take the same element: its gradients add up, in float32
    for half types as ATen's CUDA kernel does (its CPU kernel adds in bf16: within bf16's
    tolerance of it), in output order (float32: equal)."""
    x = _ties((2, 3, 9, 10), dtype, seed=4)
    out = aten.max_pool2d_with_indices(x, *form)[0]
    g = rand(tuple(out.shape), dtype, seed=5)
    if layout == "channels_last":
        x, g = x.contiguous(memory_format=CL), g.contiguous(memory_format=CL)
    built = check(_backward(form), g, x)
    # the indices are computed where the backward reads them, unless that unrolls too much
    assert len(built.kernels) == (1 if _inlined_loads(form) <= MAX_INLINED_LOADS else 2)
    tol = (0, 0) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(built(g, x), _backward(form)(g, x), atol=tol[0], rtol=tol[1])


def test_backward_reads_saved_indices() -> None:
    """The backward as in a training graph: indices are an input of its own."""
    form = FORMS[0]
    x = _ties((2, 3, 9, 10), torch.float32, seed=6)
    out, indices = aten.max_pool2d_with_indices(x, *form)
    g = rand(tuple(out.shape), seed=7)

    def fn(g: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward(g, x, *form, indices) * 2

    built = check(fn, g, x, indices)
    assert len(built.kernels) == 1


def test_a_window_too_large_to_unroll_is_an_aten_call() -> None:
    x = rand((1, 2, 12, 12), seed=8)
    form = ([9, 9], [1, 1], [0, 0], [1, 1], False)
    built = check(lambda x: [t * 2 for t in _pool(form)(x)], x, lowered=False)
    assert built.fallback_ops == ["aten.max_pool2d_with_indices.default"]


def test_relu_and_pooling_fuse_into_one_kernel() -> None:
    """An inference stem's ReLU is computed in the pooling's window loads, and the next
    pointwise op in the same kernel."""
    x = rand((2, 4, 11, 12), seed=9).contiguous(memory_format=CL)

    def fn(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        pooled = aten.max_pool2d_with_indices(torch.relu(x * scale), [3, 3], [2, 2], [1, 1])[0]
        return pooled + 1

    scale = rand((4, 1, 1), seed=10)
    built = check(fn, x, scale)
    assert [k.kind for k in built.kernels] == ["pointwise"]


class _Stem(nn.Module):
    """resnet's stem: convolution, batch norm, ReLU, 3x3 max pooling with stride 2 (batch
    statistics only: the forward's outputs are the result and the saved activations)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8, track_running_stats=False)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.relu(self.bn(self.conv(x)))))


def test_a_resnet_stem_trains_like_eager() -> None:
    from compiler.lowering.tracing import trace_training  # imports Triton (see the sm_90 test)

    torch.manual_seed(0)
    model, x = _Stem(), rand((2, 3, 12, 12), seed=11)
    fwd, bwd, fwd_in, bwd_in = trace_training(model, [x])
    built_fwd = compiler.build(fwd, None, fwd_in)
    built_bwd = compiler.build(bwd, None, bwd_in)
    assert not any("max_pool" in op for op in built_fwd.fallback_ops + built_bwd.fallback_ops)
    built_fwd.poison = built_bwd.poison = True
    outs = list(built_fwd(*fwd_in))
    grads = built_bwd(*outs[1:len(bwd_in)], torch.cos(outs[0]) / outs[0].numel())
    want = model(x)
    want_grads = torch.autograd.grad(want.sin().mean(), list(model.parameters()))
    assert_matches(outs[0], want.detach(), TOL[torch.float32])
    for name, got, expected in zip([n for n, _ in model.named_parameters()], grads, want_grads,
                                   strict=False):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4, msg=name)


def test_indices_of_a_graph_traced_with_kilns_table_stay_whole() -> None:
    """kiln's decomposition table keeps the pooling whole for the compiler to lower."""
    gm = trace(_pool(FORMS[0]), rand((1, 1, 5, 5)))
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"][0] == \
        aten.max_pool2d_with_indices.default


# avg_pool2d's (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
# resnet-D's shortcut pooling, padding counted or not, ceil mode's partial windows, an
# override, and a non-square window.
AVG_FORMS = [
    ([2, 2], [2, 2], [0, 0], True, False, None),
    ([3, 3], [2, 2], [1, 1], False, True, None),
    ([3, 3], [2, 2], [1, 1], True, False, None),
    ([3, 3], [2, 2], [1, 1], True, True, None),
    ([2, 3], [1, 2], [1, 1], False, True, 5),
]


def _avg(form: tuple) -> object:
    return lambda x: aten.avg_pool2d(x, *form)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("form", AVG_FORMS, ids=[f"form{i}" for i in range(len(AVG_FORMS))])
def test_avg_pooling_is_atens(form: tuple, layout: str, dtype: torch.dtype) -> None:
    x = rand((2, 3, 9, 10), dtype, seed=12)
    out = _avg(form)(x)
    g = rand(tuple(out.shape), dtype, seed=13)
    if layout == "channels_last":
        x, g = x.contiguous(memory_format=CL), g.contiguous(memory_format=CL)
    built = check(_avg(form), x)
    assert len(built.kernels) == 1

    def backward(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return aten.avg_pool2d_backward(g, x, *form)

    built = check(backward, g, x)
    assert len(built.kernels) == 1


def _compile_stem_for_sm90() -> list[str]:
    """In a spawned process (Triton imported with the interpreter off): every kernel of the
    stem's training graphs, of a bf16 channels-last max pooling and its backward, and of
    average and adaptive average pooling forward and backward, compiled for sm_90; their
    names."""
    import os

    os.environ["TRITON_INTERPRET"] = "0"  # before Triton loads
    os.environ["KILN_COMPILE_WORKERS"] = "0"  # compiled here, one by one
    from compiler import aot
    from compiler.lowering.tracing import trace_training

    torch.manual_seed(0)
    fwd, bwd, fwd_in, bwd_in = trace_training(_Stem(), [rand((2, 3, 12, 12), seed=11)])
    x = rand((2, 3, 9, 10), torch.bfloat16, seed=14).contiguous(memory_format=CL)
    g = rand(tuple(_pool(FORMS[2])(x)[0].shape), torch.bfloat16, seed=15).contiguous(memory_format=CL)
    graphs = [(fwd, fwd_in), (bwd, bwd_in), (trace(_backward(FORMS[2]), g, x), [g, x]),
              (trace(_pool(FORMS[1]), x), [x]), (trace(_avg(AVG_FORMS[3]), x), [x])]
    avg_g = rand(tuple(_avg(AVG_FORMS[2])(x).shape), torch.bfloat16, seed=16)
    graphs.append((trace(lambda g, x: aten.avg_pool2d_backward(g, x, *AVG_FORMS[2]), avg_g, x), [avg_g, x]))
    adaptive_g = rand((2, 3, 4, 7), torch.bfloat16, seed=19)
    graphs += [(trace(lambda x: aten._adaptive_avg_pool2d(x, [4, 7]), x), [x]),
               (trace(aten._adaptive_avg_pool2d_backward, adaptive_g, x), [adaptive_g, x])]
    names = []
    for gm, inputs in graphs:
        for spec in aot.launch_specs(compiler.build(gm, None, inputs)):
            aot.compile_for_target(spec, 90)
            names.append(spec.kernel)
    return names


@pytest.mark.slow
def test_pooling_kernels_compile_for_sm90() -> None:
    """The interpreter runs what the GPU compiler may refuse: compile them for an H200."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        names = pool.submit(_compile_stem_for_sm90).result(timeout=900)
    assert sum("pool2d" in n for n in names) >= 8, names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("size", [[3, 5], [9, 2], [4, 7]], ids=["uneven", "uneven_rows", "even_and_wider"])
def test_adaptive_avg_pooling_is_atens(size: list[int], layout: str, dtype: torch.dtype) -> None:
    """Windows of uneven widths (9 -> 3 rows are even, 10 -> 5 columns too, 9 -> 2 and
    9 -> 4 are not, 10 -> 7 windows overlap)."""
    x = rand((2, 3, 9, 10), dtype, seed=17)
    out = aten._adaptive_avg_pool2d(x, size)
    g = rand(tuple(out.shape), dtype, seed=18)
    if layout == "channels_last":
        x, g = x.contiguous(memory_format=CL), g.contiguous(memory_format=CL)
    built = check(lambda x: aten._adaptive_avg_pool2d(x, size), x)
    assert len(built.kernels) == 1
    built = check(aten._adaptive_avg_pool2d_backward, g, x)
    assert len(built.kernels) == 1
