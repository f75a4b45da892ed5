"""Validation remembers what an op gave on the meta device by op, argument layouts and
other arguments (compiler/wire/fx.py, compiler/wire/memo.py): a model's repeated layers
are run once, a remembered result is what running the op gives, and views and in-place
ops always run (the aliases a graph makes stay its own)."""

from __future__ import annotations

import pytest
import torch

import compiler
from compiler.wire import fx as wire_fx
from tests.corpus import case, case_names

aten = torch.ops.aten


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The ops validation runs (a remembered one is not run), as their results are kept."""
    wire_fx._MEMO.clear()
    ran: list[object] = []
    real = wire_fx._layouts
    monkeypatch.setattr(wire_fx, "_layouts", lambda result: ran.append(1) or real(result))
    yield ran
    wire_fx._MEMO.clear()


def _layouts_of(graph: compiler.Graph) -> list:
    return [(n.name, wire_fx._layouts(n.meta.get("wire_value")))
            for n in graph.to_fx().graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("name", case_names())
def test_a_remembered_result_is_what_running_the_op_gives(
        name: str, runs: list, monkeypatch: pytest.MonkeyPatch) -> None:
    wire = compiler.to_wire(case(name).gm, case(name).example_inputs)
    first = compiler.from_wire(wire)
    ran_first = len(runs)
    runs.clear()
    again = compiler.from_wire(wire)
    assert ran_first > 0 and runs == []  # every fresh result remembered
    monkeypatch.setattr(wire_fx._MEMO, "get", lambda key: None)
    fresh = compiler.from_wire(wire)
    assert first.nodes == again.nodes == fresh.nodes  # each node's op, arguments and meta
    assert _layouts_of(first) == _layouts_of(again) == _layouts_of(fresh)


def test_repeated_layers_are_run_once(runs: list) -> None:
    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2 + 1)

    def model(x: torch.Tensor) -> torch.Tensor:
        return block(block(block(x)))

    from tests.compiler.oputil import rand, trace

    x = rand((4, 8))
    compiler.from_wire(compiler.to_wire(trace(model, x), [x]))
    assert len(runs) == 3  # mul, add, tanh: layers two and three are remembered


def test_views_and_in_place_ops_always_run() -> None:
    assert wire_fx._fresh_results(aten.add.Tensor)
    assert wire_fx._fresh_results(aten.native_layer_norm.default)
    assert not wire_fx._fresh_results(aten.view.default)  # its result aliases its input
    assert not wire_fx._fresh_results(aten.add_.Tensor)
    assert not wire_fx._fresh_results(aten.copy_.default)


def test_the_key_tells_apart_what_changes_a_result(runs: list) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x + 1, x + 1.0, x + True, x.t() + 1

    from tests.compiler.oputil import trace

    x = torch.arange(6).reshape(2, 3)
    graph = compiler.from_wire(compiler.to_wire(trace(fn, x), [x]))
    adds = [n for n in graph.nodes if n.op == "aten.add.Tensor"]
    assert [n.meta.dtype for n in adds] == [torch.int64, torch.float32, torch.int64, torch.int64]
    assert adds[3].meta.shape == (3, 2)


def test_an_entry_stays_small() -> None:
    """A service's memo serves every client: a long list of arguments or results is run
    each time, not kept (a `cat` of thousands of inputs would make a large key)."""
    from compiler.wire.memo import MAX_LIST, plain_value

    t = torch.empty((2, 3), device="meta")
    assert wire_fx._memo_key(aten.cat.default, ([t] * 3, 0), {}) is not None
    assert wire_fx._memo_key(aten.cat.default, ([t] * (MAX_LIST + 1), 0), {}) is None
    assert wire_fx._layouts([t] * (MAX_LIST + 1)) is None
    with pytest.raises(TypeError):
        plain_value(list(range(MAX_LIST + 1)))
