"""Channels-last convolutions (issue 13, `compiler/lowering/layout.py`): inference graphs run
their convolutions on NHWC copies, pointwise kernels walk NHWC values in memory order, and
results match eager (interpreter, ragged sizes); training forwards keep NCHW under `auto`;
convolution results are given the layout the device's kernels give them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compiler.ir import TensorMeta, contiguous_strides, storage_order
from compiler.lowering import frontend
from compiler.lowering.frontend import lower_graph
from compiler.lowering.layout import ENV, channels_last, policy
from tests.compiler.oputil import assert_matches, check, rand, trace

aten = torch.ops.aten


@pytest.fixture
def layout(monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    def set_(value: str) -> None:
        monkeypatch.setenv(ENV, value)
    yield set_
    frontend._CACHE.clear()


class _Block(nn.Module):
    """conv-bn-relu, conv-bn, residual add, relu, then pooling and a linear head."""

    def __init__(self, c: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.head = nn.Linear(c, 5)
        for bn in (self.bn1, self.bn2):  # statistics that are not the identity
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.stem(x)))
        y = torch.relu(self.bn2(self.conv(y)) + y)
        return self.head(y.mean((2, 3)))


def _inference_graph(model: nn.Module, x: torch.Tensor) -> tuple[Callable, list[torch.Tensor]]:
    """`model` as a function of its input and its state (what AOTAutograd's inference graph
    takes), and those inputs."""
    params = [p.detach() for p in model.parameters()] + [b for b in model.buffers()]
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]

    def fn(x: torch.Tensor, *state: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, dict(zip(names, state, strict=True)), (x,))

    return fn, [x, *params]


def _convs(program) -> list[torch.fx.Node]:  # noqa: ANN001
    return [n for n in program.gm.graph.nodes if n.target is aten.convolution.default]


def test_inference_convolutions_run_channels_last_and_match_eager(layout) -> None:  # noqa: ANN001
    layout("auto")
    torch.manual_seed(0)
    model = _Block().eval()
    fn, inputs = _inference_graph(model, rand((2, 3, 7, 5), seed=1))  # ragged H and W
    with torch.no_grad():
        built = check(fn, *inputs, lowered=False)
    convs = _convs(built.program)
    assert len(convs) == 2
    for conv in convs:
        for value in conv.args[:2]:
            assert channels_last(value.meta["kiln_meta"]), value.name
        assert channels_last(conv.meta["kiln_meta"])
    walked = [g for g in built.program.kernels if g.kind == "pointwise" and g.domain.order]
    assert walked, "the NHWC batch-norm kernels walk memory order"
    assert all(g.domain.order == (0, 2, 3, 1) for g in walked)


def test_a_pointwise_kernel_over_nhwc_values_reads_and_writes_them_in_memory_order() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(a) * b + 1.0

    a = rand((3, 5, 7, 11), seed=2).to(memory_format=torch.channels_last)
    b = rand((3, 5, 7, 11), seed=3).to(memory_format=torch.channels_last)
    built = check(fn, a, b)
    (group,) = built.program.kernels
    assert group.domain.order == (0, 2, 3, 1)
    source = built.kernels[0].source
    assert "tl.load(in_ptr0 + xindex" in source and "tl.store(out_ptr0 + xindex" in source
    out = built(a, b)
    assert out.stride() == (fn(a, b)).stride()


def test_row_major_inputs_of_an_nhwc_kernel_are_read_at_their_own_strides() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b  # a is NHWC, b row-major: the kernel walks a's order

    a = rand((2, 3, 5, 4), seed=4).to(memory_format=torch.channels_last)
    b = rand((2, 3, 5, 4), seed=5)
    check(fn, a, b)


def test_training_forward_keeps_nchw_under_auto_and_converts_under_on(layout) -> None:  # noqa: ANN001
    """A forward that returns its activations (what a training forward saves for the
    backward) would copy them all back: `auto` leaves it; `on` converts and copies back
    to the strides the caller traced."""
    torch.manual_seed(0)
    model = _Block().eval()

    def fn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.relu(torch.nn.functional.conv2d(x, w1, padding=1))
        b = torch.nn.functional.conv2d(a, w2, padding=1)
        return a, b

    x = rand((2, 3, 6, 5), seed=6)
    w1, w2 = model.stem.weight.detach(), model.conv.weight.detach()
    gm = trace(fn, x, w1, w2)
    layout("auto")
    program, _ = lower_graph(gm, [x, w1, w2])
    assert not any(n.target is aten.clone.default for n in program.gm.graph.nodes)
    layout("on")
    built = check(fn, x, w1, w2, lowered=False)
    assert all(channels_last(c.meta["kiln_meta"]) for c in _convs(built.program))
    for got, want in zip(built(x, w1, w2), fn(x, w1, w2), strict=True):
        assert got.stride() == want.stride() == contiguous_strides(tuple(want.shape))


def test_off_and_grouped_convolutions_keep_nchw(layout) -> None:  # noqa: ANN001
    def grouped(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w, padding=1, groups=2).mean((2, 3))

    def plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w, padding=1).mean((2, 3))

    x = rand((2, 4, 5, 5), seed=7)
    layout("auto")
    program, _ = lower_graph(trace(grouped, x, rand((4, 2, 3, 3))), [x, rand((4, 2, 3, 3))])
    assert not any(channels_last(c.meta["kiln_meta"]) for c in _convs(program))
    layout("off")
    program, _ = lower_graph(trace(plain, x, rand((4, 4, 3, 3))), [x, rand((4, 4, 3, 3))])
    assert not any(channels_last(c.meta["kiln_meta"]) for c in _convs(program))
    layout("sideways")
    with pytest.raises(ValueError, match=ENV):
        policy()


def test_a_convolution_of_a_channels_last_input_is_given_the_layout_eager_gives(layout) -> None:  # noqa: ANN001
    """torch's meta kernel answers row-major for every convolution; a kernel reading the
    result at those strides would read an NHWC result wrongly."""
    layout("off")

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.nn.functional.conv2d(x, w)) * 3

    x = rand((2, 4, 6, 5), seed=8).to(memory_format=torch.channels_last)
    w = rand((3, 4, 3, 3), seed=9)
    built = check(fn, x, w, lowered=False)
    (conv,) = _convs(built.program)
    eager = aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    assert conv.meta["kiln_meta"].stride == eager.stride()
    assert_matches(built(x, w), fn(x, w))


@pytest.mark.parametrize(("shape", "stride", "order"), [
    ((2, 3, 4, 5), (60, 1, 15, 3), (0, 2, 3, 1)),   # NHWC
    ((2, 3, 4, 5), (60, 20, 5, 1), ()),             # row-major
    ((2, 3, 1, 1), (3, 1, 3, 3), ()),               # NHWC with 1x1 planes is row-major too
    ((4, 6), (1, 4), (1, 0)),                       # a transposed copy
    ((2, 3, 4), (24, 8, 1), ()),                    # padded rows: not dense
    ((2, 3, 4), (0, 4, 1), ()),                     # broadcast: not dense
])
def test_storage_order(shape: tuple, stride: tuple, order: tuple) -> None:
    assert storage_order(TensorMeta(torch.float32, shape, stride)) == order


@pytest.mark.parametrize("weight_layout", ["row-major", "channels-last"])
def test_a_1x1_weight_dense_in_both_layouts_gives_the_layout_its_strides_suggest(
        layout, weight_layout: str) -> None:  # noqa: ANN001
    """A 1x1 weight is dense as NCHW and as NHWC; eager's convolution follows its strides
    (row-major weight and input: a row-major result). Treating it as channels-last gave
    resnet's downsample convolutions the wrong layout and wrong results."""
    layout("off")

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w) + 1.0

    x = rand((2, 4, 5, 3), seed=10)
    w = rand((6, 4, 1, 1), seed=11)
    if weight_layout == "channels-last":
        w = w.to(memory_format=torch.channels_last)
    built = check(fn, x, w, lowered=False)
    (conv,) = _convs(built.program)
    eager = aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    assert conv.meta["kiln_meta"].stride == eager.stride()
    assert_matches(built(x, w), fn(x, w))


def test_a_view_that_nhwc_strides_cannot_express_reads_a_row_major_copy(layout) -> None:  # noqa: ANN001
    """A classifier flattens C, H and W of its last feature map with `view`, traced on a
    row-major value, which NHWC strides cannot express: under `on` the view reads a
    row-major copy (results as eager's); under `auto` that copy is as large as the
    convolution's result, so the graph keeps NCHW."""
    def fn(x: torch.Tensor, w: torch.Tensor, fc: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.nn.functional.conv2d(x, w, stride=2)).flatten(1) @ fc

    x, w, fc = rand((2, 3, 8, 6), seed=12), rand((5, 3, 2, 2), seed=13), rand((60, 4), seed=14)
    gm = trace(fn, x, w, fc)
    layout("on")
    built = check(fn, x, w, fc, lowered=False)
    (conv,) = _convs(built.program)
    assert channels_last(conv.meta["kiln_meta"])
    layout("auto")
    program, _ = lower_graph(gm, [x, w, fc])
    assert not any(channels_last(c.meta["kiln_meta"]) for c in _convs(program))


# ---- a resnet stage at real size compiles for sm_90 -------------------------------------

def _resnet_stage(x, w1, w2, wd, s1, b1, s2, b2, fc):  # noqa: ANN001, ANN202
    """A resnet18 basic block with a strided 1x1 downsample, then pooling and a head."""
    def bn(y, s, b):  # noqa: ANN001, ANN202 - inference batch norm: scale and shift
        return y * s[:, None, None] + b[:, None, None]

    y = torch.relu(bn(F.conv2d(x, w1, stride=2, padding=1), s1, b1))
    y = torch.relu(bn(F.conv2d(y, w2, padding=1), s2, b2) + F.conv2d(x, wd, stride=2))
    return y.mean((2, 3)) @ fc


def _resnet_stage_inputs() -> list[torch.Tensor]:
    def meta(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.bfloat16, device="meta")

    return [meta(32, 64, 56, 56), meta(128, 64, 3, 3), meta(128, 128, 3, 3), meta(128, 64, 1, 1),
            meta(128), meta(128), meta(128), meta(128), meta(128, 1000)]


def _precompile_main() -> None:
    """Build the real-size resnet stage for an sm_90 target and compile every kernel with
    Triton for sm_90 (a stand-in driver; nothing launches). Prints one JSON line."""
    from tests.compiler.precompile_sm90 import build_for_sm90

    inputs = _resnet_stage_inputs()
    schedule, built = build_for_sm90(trace(_resnet_stage, *inputs), inputs)
    print(json.dumps({
        "convs_nhwc": [channels_last(c.meta["kiln_meta"]) for c in _convs(built.program)],
        "orders": [list(g.domain.order) for g in built.program.kernels if g.kind == "pointwise"],
        "kernels": len(schedule.kernels)}), flush=True)


@pytest.mark.slow
def test_a_real_size_resnet_stage_runs_channels_last_and_compiles_for_sm90(tmp_path: Path) -> None:
    from tests.compiler.precompile_sm90 import run_module

    found = json.loads(run_module("tests.compiler.test_channels_last", tmp_path, unset=(ENV,))[-1])
    assert found["convs_nhwc"] == [True, True, True]
    assert [0, 2, 3, 1] in found["orders"]  # the NHWC batch-norm and residual kernels
    cubins = list((tmp_path / "triton").rglob("*.cubin"))
    assert len(cubins) >= found["kernels"] // 2  # kernels compiled for sm_90


if __name__ == "__main__":
    _precompile_main()
