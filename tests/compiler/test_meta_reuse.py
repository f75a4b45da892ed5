"""Lowering runs the graph on the meta device after each pass that changes it; an op whose
op, argument metadata and other arguments the process has seen takes the metadata
remembered for them (`compiler.lowering.meta_memo`) and gives what running it gives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from compiler.ir import TensorMeta
from compiler.lowering import lower, meta_memo
from compiler.lowering.lower import lower_fx, propagate_meta
from compiler.wire import device_layout
from compiler.wire.memo import plain_value
from tests.compiler.oputil import rand, trace
from tests.corpus import case, case_names


def _graph() -> tuple[fx.GraphModule, list[TensorMeta]]:
    def fn(x: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x + 1
        return y * 2, x.sum(0), x2
    x, x2 = rand((4, 6)), rand((8, 6))
    return trace(fn, x, x2), [TensorMeta.of(x), TensorMeta.of(x2)]


class _CountingLayouts:
    """Stands in for `compiler.wire.device_layout` in lowering: every op lowering runs on
    the meta device goes through its `run`, which counts the runs."""

    def __init__(self) -> None:
        self.asked: list[object] = []

    def run(self, target, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        self.asked.append(target)
        return device_layout.run(target, *args, **kwargs)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    meta_memo.forget()
    counting = _CountingLayouts()
    monkeypatch.setattr(lower, "device_layout", counting)
    yield counting.asked
    meta_memo.forget()


def test_an_op_is_run_once_per_op_argument_metadata_and_other_arguments(runs) -> None:
    gm, metas = _graph()
    propagate_meta(gm, metas)
    assert len(runs) == 3  # add, mul, sum
    runs.clear()
    propagate_meta(gm, metas)  # the same graph again: everything is remembered
    assert runs == []
    add, mul, total = (next(n for n in gm.graph.nodes if n.op == "call_function" and
                            n.target.__name__.startswith(p)) for p in ("add", "mul", "sum"))
    second = [n for n in gm.graph.nodes if n.op == "placeholder"][1]
    add.args = (second, *add.args[1:])  # y = x2 + 1: add and its user mul see other shapes
    propagate_meta(gm, metas)
    assert runs == [add.target, mul.target]
    assert add.meta["kiln_meta"].shape == mul.meta["kiln_meta"].shape == (8, 6)
    assert total.meta["kiln_meta"].shape == (6,)


def test_the_key_tells_apart_what_changes_a_result(runs) -> None:
    """1, 1.0 and True promote an integer tensor differently; -0.0 is not 0.0."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x + 1, x + 1.0, x + True, x * 1

    gm = trace(fn, torch.arange(6).reshape(2, 3))
    propagate_meta(gm, [TensorMeta.of(torch.arange(6).reshape(2, 3))])
    dtypes = [n.meta["kiln_meta"].dtype for n in gm.graph.nodes if n.op == "call_function"]
    assert dtypes == [torch.int64, torch.float32, torch.int64, torch.int64]
    assert plain_value(-0.0) != plain_value(0.0)
    assert plain_value(1) != plain_value(1.0) != plain_value(True)
    with pytest.raises(TypeError):
        plain_value(torch.ones(1))


def _all_metas(program) -> list:
    return [(n.name, n.meta.get("kiln_meta")) for n in program.gm.graph.nodes]


def test_lowering_with_remembered_metadata_gives_what_running_every_op_gives(
        monkeypatch: pytest.MonkeyPatch, runs) -> None:
    x, w, b = rand((16, 32), seed=1), rand((32,), seed=2), rand((32,), seed=3)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.layer_norm(x, (32,), w, b)
        return torch.softmax(F.gelu(h), -1), h.var(0), (h.t() @ x).sum(0)

    gm = trace(fn, x, w, b)
    metas = [TensorMeta.of(t) for t in (x, w, b)]
    remembered = lower_fx(gm, metas)
    assert runs
    runs.clear()
    again = lower_fx(gm, metas)
    assert runs == []
    monkeypatch.setattr(meta_memo, "remembered", lambda key: None)
    full = lower_fx(gm, metas)
    assert runs
    assert _all_metas(remembered) == _all_metas(again) == _all_metas(full)


def test_the_memo_keeps_at_most_its_bound(monkeypatch: pytest.MonkeyPatch, runs) -> None:
    monkeypatch.setattr(meta_memo._MEMO, "max_entries", 2)
    gm, metas = _graph()
    propagate_meta(gm, metas)
    assert len(runs) == 3
    runs.clear()
    propagate_meta(gm, metas)  # add was dropped for mul and sum, then mul for add, ...
    assert len(runs) == 3


def _lowered_from_wire(gm: fx.GraphModule, inputs: list, validated: bool):  # noqa: ANN202
    from compiler.wire.graph import to_graph

    graph = to_graph(gm, inputs)
    made = graph.to_fx()
    if not validated:
        for node in made.graph.nodes:
            node.meta.pop("wire_value", None)
    return lower_fx(made, list(graph.inputs), owned=True)


@pytest.mark.parametrize("name", case_names())
def test_lowering_takes_wire_validation_metas_and_gives_what_its_own_run_gives(name: str) -> None:
    """A graph made from the wire format carries the meta values its validation computed;
    lowering's first metadata run takes them instead of running the ops again, and every
    node's metadata is what running them gives (the corpus: inference, training forward
    and backward of five models, convolutions and their layout rule included)."""
    c = case(name)
    taken = _lowered_from_wire(c.gm, c.example_inputs, validated=True)
    ran = _lowered_from_wire(c.gm, c.example_inputs, validated=False)
    assert _all_metas(taken) == _all_metas(ran)


def test_the_first_metadata_run_takes_validated_values_instead_of_running_ops(runs) -> None:
    from compiler.wire.graph import to_graph

    c = case("gpt_block.train_fwd")
    graph = to_graph(c.gm, c.example_inputs)
    counted = []
    for take in (True, False):
        meta_memo.forget()
        runs.clear()
        propagate_meta(graph.to_fx(), [TensorMeta.of(i) for i in graph.inputs],
                       take_validated=take)
        counted.append(len(runs))
    assert counted[0] == 0 < counted[1]


def test_a_convolution_validation_saw_as_row_major_is_run_with_kiln_s_layout_rule() -> None:
    """Validation runs torch's meta kernel, which gives every convolution a row-major
    result; lowering's rule gives a channels-last input's convolution an NHWC one, so that
    node and the nodes after it run again instead of taking validation's values."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.conv2d(x, w)) * 3

    x = rand((2, 4, 6, 5), seed=4).to(memory_format=torch.channels_last)
    w = rand((3, 4, 3, 3), seed=5)
    gm = trace(fn, x, w)
    taken = _lowered_from_wire(gm, [x, w], validated=True)
    ran = _lowered_from_wire(gm, [x, w], validated=False)
    assert _all_metas(taken) == _all_metas(ran)
    (conv,) = [n for n in taken.gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert conv.meta["kiln_meta"].stride[1] == 1  # NHWC


def test_a_wire_graph_is_lowered_without_generating_its_python_code() -> None:
    """`Graph.to_fx` makes a lazy GraphModule: lowering's passes never read its Python code,
    so none is generated (two per graph, 10-20% of a client's build); reading it still works."""
    from compiler.wire.graph import to_graph

    c = case("gpt_block.train_fwd")
    graph = to_graph(c.gm, c.example_inputs)
    program = lower_fx(graph.to_fx(), list(graph.inputs), owned=True)
    assert type(program.gm)._needs_recompile()
    assert "torch.ops.aten" in program.gm.code
    assert not type(program.gm)._needs_recompile()


def test_a_decomposition_is_recorded_once_per_op_and_argument_metadata(monkeypatch) -> None:
    """A model's repeated layers decompose the same op on the same metadata: the
    decomposition is recorded once and spliced into each, giving what recording each would."""
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.var_mean(x, dim=0)
        b = torch.var_mean(x * 2, dim=0)  # the same metadata as a's
        c = torch.var_mean(y, dim=0)  # other shapes
        d = torch.var_mean(x, dim=1)  # other arguments
        return a[0] + b[1], c[0], d[1]

    x, y = rand((4, 16), seed=1), rand((8, 16), seed=2)
    gm = trace(f, x, y)
    with monkeypatch.context() as patch:
        patch.setattr(meta_memo, "key_of", lambda node: None)  # each recorded afresh
        fresh = lower_fx(gm, [x, y]).gm.code
    calls = []
    real = lower.record
    monkeypatch.setattr(lower, "record", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert lower_fx(gm, [x, y]).gm.code == fresh
    assert len(calls) == 3
