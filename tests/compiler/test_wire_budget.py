"""Wire validation is bounded by a work budget (issue 15, points 2 and 3): a price per op
summed before anything runs, a wall-clock bound and a cancel event while meta execution
runs, the elements of all results together, and the object and array budgets on every
path into `from_wire` (text and dicts)."""

from __future__ import annotations

import json
import threading
import time

import pytest

import compiler
from compiler.wire.schema import meta_cost
from tests.service.bombs import bicubic_chain, full_relu


def test_expensive_meta_ops_are_priced_high():
    assert meta_cost("aten.upsample_bicubic2d.default") >= 100
    assert meta_cost("aten.upsample_bicubic2d_backward.default") == \
        meta_cost("aten.upsample_bicubic2d.default")
    assert meta_cost("aten.add.Tensor") == 1


def test_a_graph_over_the_cost_budget_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setenv("KILN_MAX_VALIDATION_COST", "5000")
    body = json.dumps(bicubic_chain(20))  # 20 x 500: about a second of meta execution
    start = time.monotonic()
    with pytest.raises(compiler.WireError, match="cost 10000 units > limit 5000.*upsample_bicubic2d"):
        compiler.from_wire(body)
    assert time.monotonic() - start < 0.3


def _warm_bicubic() -> None:
    """The op's first run in a process sets torch up (about a second): the tests time
    validation's checks between nodes, not that."""
    compiler.from_wire(bicubic_chain(1, size=8))


def test_validation_stops_at_its_deadline(monkeypatch):
    _warm_bicubic()
    monkeypatch.setenv("KILN_MAX_VALIDATION_MS", "300")
    start = time.monotonic()
    with pytest.raises(compiler.WireError, match="validation took longer than 300 ms"):
        compiler.from_wire(bicubic_chain(60))  # within the cost budget, seconds of CPU
    assert time.monotonic() - start < 1.5


def test_validation_stops_when_cancelled():
    _warm_bicubic()
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(compiler.ValidationCancelled):
        compiler.from_wire(bicubic_chain(60, size=72), cancel=cancel)  # none of the above's nodes
    assert time.monotonic() - start < 1.5


def test_all_results_together_are_bounded(monkeypatch):
    compiler.from_wire(full_relu(64))
    monkeypatch.setenv("KILN_MAX_TOTAL_NUMEL", str(64 * 64 + 1))  # one result fits, two do not
    with pytest.raises(compiler.WireError, match="KILN_MAX_TOTAL_NUMEL"):
        compiler.from_wire(full_relu(64))


def test_a_dict_gets_the_object_budget_that_text_gets(monkeypatch):
    monkeypatch.setenv("KILN_MAX_NODES", "10")  # room for 1184 objects
    wire = full_relu(4)
    wire["nodes"][0]["args"][1] = [{"float": "nan"}] * 5000  # one shared dict, cheap to build
    with pytest.raises(compiler.WireError, match="too many for 10 nodes"):
        compiler.from_wire(wire)
    with pytest.raises(compiler.WireError, match="too many objects for 10 nodes"):
        compiler.from_wire(json.dumps(wire))


def test_arrays_are_bounded_in_text_and_dicts(monkeypatch):
    monkeypatch.setenv("KILN_MAX_NODES", "10")  # room for 1664 arrays
    wire = full_relu(4)
    wire["nodes"][0]["args"][1] = [[]] * 5000
    with pytest.raises(compiler.WireError, match="5\\d{3} arrays, too many for 10 nodes"):
        compiler.parse_json(json.dumps(wire))
    with pytest.raises(compiler.WireError, match="too many for 10 nodes"):
        compiler.from_wire(wire)
