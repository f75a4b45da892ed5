"""The capture helper (`compiler.lowering.tracing`) on a module that reads tensor values in
Python unless torch.compile is tracing it, as Hugging Face's models check their inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException

from compiler.lowering.tracing import trace_training


class ChecksItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and bool((x != x).any()):  # reads a value
            raise ValueError("NaN input")
        return torch.tanh(self.linear(x)).sum(-1)


def _ops(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_through_dynamo_captures_what_aot_autograd_alone_cannot() -> None:
    torch.manual_seed(0)
    module, x = ChecksItsInput(), torch.randn(4, 8)
    with pytest.raises(DataDependentOutputException):
        trace_training(module, [x])
    fwd, bwd, fwd_in, bwd_in = trace_training(module, [x], through_dynamo=True)
    assert "aten.tanh.default" in _ops(fwd) and "aten.mm.default" in _ops(bwd)
    # the inputs each graph was called with: weight, bias and x; then what the backward reads
    assert [tuple(t.shape) for t in fwd_in] == [(8, 8), (8,), (4, 8)]
    assert len(bwd_in) == len([n for n in bwd.graph.nodes if n.op == "placeholder"])
    torch.testing.assert_close(fwd(*fwd_in)[0], module(x))
