"""`to_wire_and_graph`, the client's one-pass conversion (issue 14, cold compile time): the
same document as `to_wire` and the same graph as `from_wire` of it (canonical JSON, hash,
tuning key, specs), and the same refusals."""

from __future__ import annotations

import pytest
import torch

import compiler
from compiler.wire import graph as wire_graph
from compiler.wire.graph import to_wire_and_graph
from tests.compiler.oputil import rand, trace
from tests.corpus import corpus

TARGETS = (compiler.Target.named("sm_90", name="NVIDIA H200"), compiler.Target.cpu())


@pytest.mark.parametrize("case", corpus(), ids=lambda c: c.name)
def test_same_document_and_graph_as_to_wire_then_from_wire(case) -> None:
    wire, graph = to_wire_and_graph(case.gm, case.example_inputs)
    expected_wire = compiler.to_wire(case.gm, case.example_inputs)
    expected = compiler.from_wire(expected_wire)
    assert wire == expected_wire
    assert graph.canonical_text() == expected.canonical_text()
    assert compiler.graph_hash(graph) == compiler.graph_hash(expected)
    for target in TARGETS:
        assert compiler.tuning_key(graph, target) == compiler.tuning_key(expected, target)
    assert graph.inputs == expected.inputs
    assert graph.nodes == expected.nodes  # every node's op, arguments and meta
    assert graph.outputs == expected.outputs and graph.constants == expected.constants


def test_validation_runs_once(monkeypatch) -> None:
    case = corpus()[0]
    runs = []
    infer = wire_graph.infer_meta
    monkeypatch.setattr(wire_graph, "infer_meta", lambda *a, **k: runs.append(1) or infer(*a, **k))
    to_wire_and_graph(case.gm, case.example_inputs)
    assert len(runs) == 1
    compiler.from_wire(compiler.to_wire(case.gm, case.example_inputs))
    assert len(runs) == 3


def _many_refs(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x] * 1500)  # one node whose arguments are 1500 objects


def test_a_graph_from_wire_refuses_is_refused(monkeypatch) -> None:
    x = rand((2, 3))
    gm = trace(_many_refs, x)
    monkeypatch.setenv("KILN_MAX_NODES", "10")  # room for 1184 objects
    wire = compiler.to_wire(gm, [x])  # to_wire itself does not count containers
    with pytest.raises(compiler.WireError, match="too many for 10 nodes"):
        compiler.from_wire(wire)
    with pytest.raises(compiler.WireError, match="too many for 10 nodes"):
        to_wire_and_graph(gm, [x])
