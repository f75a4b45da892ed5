"""Each gradient a training backward returns has its input's layout, so AccumulateGrad keeps
it as `.grad` instead of copying it (compiler/lowering/gradient_layout.py, applied by the
client's partitioner in kiln/backend.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd

import kiln
from compiler.lowering.gradient_layout import gradients_in_input_layouts
from kiln.backend import _Partition

pytestmark = pytest.mark.usefixtures("kiln_state")
aten = torch.ops.aten
CL = torch.channels_last


class ChannelsLastWeight(nn.Module):
    """A convolution that reads a channels-last copy of its row-major weight (as a
    channels-last training step does): cuDNN and the meta kernel then give the weight's
    gradient channels-last; and a linear layer whose gradient is row-major already."""

    def __init__(self, cin: int, cout: int, k: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(cout, cin, k, k) / (cin * k * k) ** 0.5)
        self.proj = nn.Linear(cout, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.w.contiguous(memory_format=CL), padding=self.w.shape[-1] // 2)
        return self.proj(y.relu().permute(0, 2, 3, 1))


def _graphs(module: nn.Module, x: torch.Tensor) -> dict[str, torch.fx.GraphModule]:
    """The forward and backward AOTAutograd gives kiln's partitioner for `module(x)`."""
    seen: dict[str, torch.fx.GraphModule] = {}

    def keep(kind: str):
        def compile_(gm: torch.fx.GraphModule, _inputs: list) -> object:
            seen[kind] = gm
            return make_boxed_func(gm)
        return compile_

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=_Partition())
    torch.compile(module, backend=backend)(x).sum().backward()
    return seen


def _returned(backward: torch.fx.GraphModule) -> list[object]:
    out = next(n for n in reversed(backward.graph.nodes) if n.op == "output")
    return list(out.args[0])


def test_a_channels_last_weight_gradient_is_copied_back_to_the_weights_layout():
    # resnet's third stage at batch 8: a cuBLAS-sized weight (256 x 256 x 3 x 3)
    module = ChannelsLastWeight(256, 256, 3)
    graphs = _graphs(module, torch.randn(8, 256, 14, 14))
    returned = _returned(graphs["backward"])
    grad_w = returned[0]
    assert grad_w.target is aten.clone.default
    assert grad_w.kwargs["memory_format"] == torch.contiguous_format
    assert grad_w.meta["val"].stride() == module.w.stride()
    # the linear layer's gradients were row-major already: returned as computed
    copies = [n for n in returned if getattr(n, "target", None) is aten.clone.default]
    assert copies == [grad_w]
    assert module.w.grad.stride() == module.w.stride()


def test_a_channels_last_parameter_gets_its_gradient_channels_last():
    module = ChannelsLastWeight(8, 16, 3)
    module.w.data = module.w.data.contiguous(memory_format=CL)
    graphs = _graphs(module, torch.randn(2, 8, 6, 6))
    # the weight's own layout is what the gradient has: no copy anywhere
    assert not [n for n in _returned(graphs["backward"])
                if getattr(n, "target", None) is aten.clone.default]


def test_graphs_that_do_not_pair_an_output_per_input_are_left_alone():
    module = ChannelsLastWeight(4, 4, 3)
    graphs = _graphs(module, torch.randn(1, 4, 5, 5))
    forward, backward = graphs["forward"], graphs["backward"]
    code = backward.code
    with forward.graph.inserting_before(next(iter(forward.graph.nodes))):
        forward.graph.placeholder("rng_seed")  # one input more than the backward has outputs
    assert gradients_in_input_layouts(forward, backward) == 0
    assert backward.code == code


def test_kilns_backward_returns_the_weights_layout_and_the_same_gradients_as_eager(
        kiln_warnings):
    kiln.configure(url=None)
    torch.manual_seed(0)
    module = ChannelsLastWeight(4, 6, 3)
    reference = ChannelsLastWeight(4, 6, 3)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 4, 5, 5)
    returned: list[tuple[int, ...]] = []
    module.w.register_hook(lambda g: returned.append(g.stride()))
    torch.compile(module, backend=kiln.remote_compile)(x).sum().backward()
    reference(x).sum().backward()
    assert returned == [module.w.stride()]  # what autograd got from kiln's backward
    torch.testing.assert_close(module.w.grad, reference.w.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(module.proj.weight.grad, reference.proj.weight.grad,
                               rtol=1e-4, atol=1e-5)


class ReadTwice(nn.Module):
    """One weight read twice through channels-last copies, by a convolution and by a square:
    its gradient is the sum of two channels-last values. The images take no gradient (the
    backward returns None for them)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4, 3, 3) / 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.w.contiguous(memory_format=CL), padding=1)
        return y.flatten(1).sum(1) + (self.w.contiguous(memory_format=CL) ** 2).sum()


def test_a_weight_read_twice_trains_as_eagerly_with_its_own_layout(kiln_warnings):
    kiln.configure(url=None)
    torch.manual_seed(0)
    module, reference = ReadTwice(), ReadTwice()
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 4, 5, 5)
    returned = _returned(_graphs(ReadTwice(), x)["backward"])
    assert returned[1] is None  # the images: no gradient, nothing to lay out
    assert returned[0].meta["val"].stride() == module.w.stride()
    torch._dynamo.reset()
    got: list[tuple[int, ...]] = []
    module.w.register_hook(lambda g: got.append(g.stride()))
    torch.compile(module, backend=kiln.remote_compile)(x).sum().backward()
    reference(x).sum().backward()
    assert got == [module.w.stride()]
    torch.testing.assert_close(module.w.grad, reference.w.grad, rtol=1e-4, atol=1e-5)
