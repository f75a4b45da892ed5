"""kiln.graph/1 round-trips: every corpus graph, enum and constant arguments, strides."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler import Graph, WireError, decompositions, from_wire, random_inputs, to_wire
from compiler.wire.graph import to_graph
from tests.corpus import case, case_names


def _same_outputs(a: tuple, b: tuple) -> bool:
    assert len(a) == len(b)
    return all(
        (x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y))
        or torch.allclose(x, y, equal_nan=True)
        for x, y in zip(a, b, strict=True)
    )


def _canonical_text(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


@pytest.mark.parametrize("name", case_names())
def test_corpus_graph_round_trips_and_reserializes_identically(name: str) -> None:
    c = case(name)
    wire = to_wire(c.gm, c.example_inputs)
    graph = from_wire(json.dumps(wire, allow_nan=False))
    assert graph.to_json() == wire

    # Fresh random inputs; random ops (dropout) see the same seed on both sides.
    inputs = random_inputs(graph, seed=1)
    torch.manual_seed(0)
    expected = c.gm(*inputs)
    torch.manual_seed(0)
    actual = graph.to_fx()(*inputs)
    assert _same_outputs(tuple(expected), actual)

    again = to_wire(graph.to_fx(), c.example_inputs)
    assert _canonical_text(again) == _canonical_text(wire)
    assert to_wire(graph.to_fx(), graph.inputs) == wire  # input descriptions serve as well


def test_from_wire_accepts_dict_text_and_bytes() -> None:
    c = case("mlp.train_bwd")
    wire = to_wire(c.gm, c.example_inputs)
    text = json.dumps(wire)
    for form in (wire, text, text.encode("utf-8"), bytearray(text.encode("utf-8"))):
        assert from_wire(form).to_json() == wire


def test_to_graph_equals_from_wire_of_to_wire() -> None:
    c = case("convnet.train_fwd")
    assert to_graph(c.gm, c.example_inputs).canonical_text() == from_wire(to_wire(c.gm, c.example_inputs)).canonical_text()


def test_names_are_canonical_positions() -> None:
    c = case("gpt_block.fwd")
    graph = from_wire(to_wire(c.gm, c.example_inputs))
    n_inputs = len(graph.inputs)
    assert [i.name for i in graph.inputs] == [f"n{k}" for k in range(n_inputs)]
    assert [n.name for n in graph.nodes] == [f"n{n_inputs + k}" for k in range(len(graph.nodes))]
    gm = graph.to_fx()
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert placeholders == [i.name for i in graph.inputs]
    assert {n.name for n in gm.graph.nodes if n.op == "call_function"} == {n.name for n in graph.nodes}


def test_graph_exposes_inputs_and_op_summary() -> None:
    c = case("mlp.fwd")
    graph = from_wire(to_wire(c.gm, c.example_inputs))
    x = graph.inputs[-1]
    assert (x.dtype, x.shape, x.stride, x.storage_offset, x.requires_grad) == (torch.float32, (4, 128), (128, 1), 0, False)
    assert graph.op_summary() == {"aten.addmm.default": 2, "aten.permute.default": 2, "aten.relu.default": 1}


def _enum_and_constant_fn(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    zeros = torch.zeros(2, 3, dtype=torch.float64, layout=torch.strided, device="cpu")
    filled = x.masked_fill(mask, float("-inf"))
    nan = torch.full((3,), float("nan"))
    half = x.to(torch.float16).clone(memory_format=torch.contiguous_format)
    image = x.reshape(1, 2, 3, 1).contiguous(memory_format=torch.channels_last)
    stacked = torch.cat([x, filled + torch.tensor([1.0, 2.0, 3.0])], dim=0)
    return zeros, filled, nan, half, image, stacked, x.sum() * math.inf


def test_enum_nonfinite_and_constant_arguments_round_trip() -> None:
    x, mask = torch.randn(2, 3), torch.tensor([[True, False, True], [False, False, True]])
    gm = make_fx(_enum_and_constant_fn, decomposition_table=decompositions())(x, mask)
    wire = to_wire(gm, [x, mask])
    text = json.dumps(wire, allow_nan=False)  # non-finite floats are tagged, never bare
    for tag in ('{"float": "-inf"}', '{"float": "nan"}', '{"float": "inf"}', '{"dtype": "float64"}',
                '{"layout": "strided"}', '{"device": "cpu"}', '{"memory_format": "channels_last"}'):
        assert tag in text, tag
    assert len(wire["constants"]) == 1 and wire["constants"][0]["data"] == [1.0, 2.0, 3.0]
    graph = from_wire(text)
    assert _same_outputs(tuple(gm(x, mask)), graph.to_fx()(x, mask))
    assert to_wire(graph.to_fx(), [x, mask]) == wire


def test_strided_and_offset_inputs_keep_their_layout() -> None:
    base = torch.randn(5, 8)
    view = base[1:, ::2]  # storage offset 8, strides (8, 2)
    gm = make_fx(lambda t: t * 2 + 1, decomposition_table=decompositions())(view)
    graph = from_wire(to_wire(gm, [view]))
    (inp,) = graph.inputs
    assert (inp.shape, inp.stride, inp.storage_offset) == ((4, 4), (8, 2), 8)
    (fresh,) = random_inputs(graph, seed=3)
    assert (fresh.shape, fresh.stride(), fresh.storage_offset()) == ((4, 4), (8, 2), 8)
    assert torch.equal(graph.to_fx()(fresh)[0], fresh * 2 + 1)


def test_to_fx_device_override_runs_on_meta_tensors() -> None:
    c = case("embedding_ce.train_bwd")  # scalar_tensor/full_like carry device=cpu
    graph = from_wire(to_wire(c.gm, c.example_inputs))
    meta_inputs = [t.to("meta") for t in c.example_inputs]
    outputs = graph.to_fx(device="meta")(*meta_inputs)
    assert all(o is None or o.device.type == "meta" for o in outputs)


def test_graph_is_immutable_through_to_json() -> None:
    c = case("mlp.fwd")
    graph = from_wire(to_wire(c.gm, c.example_inputs))
    doc = graph.to_json()
    doc["nodes"].clear()
    assert graph.to_json()["nodes"] and isinstance(graph, Graph)


def test_to_wire_names_the_node_it_cannot_send() -> None:
    x = torch.randn(3)
    gm = torch.fx.symbolic_trace(lambda t: torch.sin(t) + 1)  # torch-level, not aten
    with pytest.raises(WireError, match=r"node 'sin'.*not an aten or prims op"):
        to_wire(gm, [x])
    with pytest.raises(WireError, match="placeholders but 2 example inputs"):
        to_wire(gm, [x, x])
