"""`python -m bench.coverage`: where each aten node of a graph ends up."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.coverage import count, node_placement
from compiler.lowering.frontend import lower_graph
from tests.compiler.oputil import rand, trace


def test_placement_by_op() -> None:
    x, w = rand((1, 2, 6, 6), seed=1), rand((3, 2, 3, 3), seed=2)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, w)
        _dead = y.exp()
        return torch.relu(y).sum(-1) + y.flatten(1).t().sum()

    gm = trace(fn, x, w)
    program, _ = lower_graph(gm, [x, w])
    c = count(program)
    assert c[("aten.convolution.default", "aten")] == 1
    assert c[("aten.relu.default", "triton")] == 1
    assert c[("aten.sum.dim_IntList", "triton")] + c[("aten.sum.default", "triton")] == 2
    assert set(node_placement(program).values()) <= {"triton", "aten", "view", "removed"}
    assert "removed" in node_placement(program).values()  # the dead exp
