"""A compiled graph's wire dict: the one conversion made, or, for a graph from a plan
(which the service already holds), the graph's own copied only when something asks."""

from __future__ import annotations

import torch

import compiler
from kiln.compiled import CompiledGraph
from tests.compiler.oputil import rand, trace


def _graph() -> tuple[torch.fx.GraphModule, compiler.Graph, dict]:
    x = rand((4, 8))
    gm = trace(lambda x: torch.tanh(x) * 2, x)
    wire = compiler.to_wire(gm, [x])
    return gm, compiler.from_wire(wire), wire


def test_the_conversion_s_wire_is_kept() -> None:
    gm, graph, wire = _graph()
    entry = CompiledGraph(gm)
    entry.describe("k" * 64, graph, compiler.Target.cpu(), wire)
    assert entry.wire is wire


def test_a_planned_graph_copies_its_wire_only_when_asked(monkeypatch) -> None:
    gm, graph, wire = _graph()
    copies = []
    real = compiler.Graph.to_json
    monkeypatch.setattr(compiler.Graph, "to_json", lambda self: copies.append(1) or real(self))
    entry = CompiledGraph(gm)
    assert entry.wire is None  # not described yet
    entry.describe("k" * 64, graph, compiler.Target.cpu())
    assert copies == []
    assert entry.wire == wire and entry.wire == wire
    assert copies == [1]
