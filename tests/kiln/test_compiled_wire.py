"""A compiled graph's wire document: the dict the one conversion made, or, for a graph from
a plan (which the service already holds), the graph's canonical text, never a copy."""

from __future__ import annotations

import json

import pytest
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


def test_a_planned_graph_sends_its_canonical_text_without_copying(monkeypatch) -> None:
    gm, graph, wire = _graph()
    monkeypatch.setattr(compiler.Graph, "to_json", lambda self: pytest.fail("copied"))
    entry = CompiledGraph(gm)
    assert entry.wire is None  # not described yet
    entry.describe("k" * 64, graph, compiler.Target.cpu())
    assert entry.wire == graph.canonical_text() and json.loads(entry.wire) == wire
