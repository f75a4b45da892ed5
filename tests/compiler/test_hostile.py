"""Hostile wire input never crashes and never executes anything: each is a WireError
whose message names what is wrong."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler import WireError, decompositions, from_wire, to_wire
from compiler.wire.limits import limits


def _small_wire() -> dict:
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    gm = make_fx(lambda a, b: torch.relu(a @ b) * 2.0, decomposition_table=decompositions())(x, w)
    return to_wire(gm, [x, w])


@pytest.fixture
def wire() -> dict:
    return _small_wire()


def _node(wire: dict, op: str) -> dict:
    return next(n for n in wire["nodes"] if n["op"] == op)


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_bytes_are_refused_without_unpickling(tmp_path) -> None:
    marker = tmp_path / "pwned"
    for protocol in (0, pickle.HIGHEST_PROTOCOL):
        body = pickle.dumps(_Exploit(str(marker)), protocol=protocol)
        with pytest.raises(WireError, match="not (valid JSON|UTF-8 JSON)"):
            from_wire(body)
    assert not marker.exists()


def test_python_source_is_refused(tmp_path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(WireError, match="not valid JSON"):
        from_wire(f"__import__('os').system('touch {marker}')")
    assert not marker.exists()


@pytest.mark.parametrize("op", ["builtins.eval", "os.system", "aten.__class__.default", "torch.ops.aten.add.Tensor",
                                "aten.add", "prims.__getattribute__.default", "aten.add.Tensor.extra"])
def test_ops_outside_the_allowlist_are_refused(wire: dict, op: str) -> None:
    node = _node(wire, "aten.relu.default")
    node["op"] = op
    with pytest.raises(WireError, match=rf"node '{node['name']}'.*not allowed"):
        from_wire(wire)


@pytest.mark.parametrize("op, message", [
    ("aten.from_file.default", "acts outside the graph"),
    ("aten.save.default", "acts outside the graph"),
    ("aten._print.default", "acts outside the graph"),
    ("aten.add.str", "returns no tensor"),
    ("aten.format.default", "returns no tensor"),
    ("aten._local_scalar_dense.default", "returns no tensor"),
])
def test_aten_ops_with_side_effects_or_no_tensor_are_refused(wire: dict, op: str, message: str) -> None:
    _node(wire, "aten.relu.default")["op"] = op
    with pytest.raises(WireError, match=message):
        from_wire(wire)


def test_unknown_aten_op_is_refused(wire: dict) -> None:
    _node(wire, "aten.relu.default")["op"] = "aten.definitely_not_an_op.default"
    with pytest.raises(WireError, match="does not exist"):
        from_wire(wire)


def test_reference_to_a_missing_node(wire: dict) -> None:
    node = _node(wire, "aten.relu.default")
    node["args"][0] = {"ref": "ghost"}
    with pytest.raises(WireError, match=rf"node '{node['name']}'.*'ghost', which is not defined"):
        from_wire(wire)


def test_reference_to_a_later_node(wire: dict) -> None:
    first, last = wire["nodes"][0], wire["nodes"][-1]
    first["args"][0] = {"ref": last["name"]}
    with pytest.raises(WireError, match="comes later"):
        from_wire(wire)


def test_cycles_are_refused(wire: dict) -> None:
    a, b = wire["nodes"][0], wire["nodes"][1]
    a["args"][0] = {"ref": b["name"]}  # b already refers to a
    with pytest.raises(WireError, match="cycles are not allowed"):
        from_wire(wire)

    fresh = _small_wire()
    node = fresh["nodes"][1]
    node["args"][0] = {"ref": node["name"]}
    with pytest.raises(WireError, match="refers to itself"):
        from_wire(fresh)


def test_ten_million_nodes_are_refused_by_the_count(wire: dict) -> None:
    huge = dict(wire, nodes=[wire["nodes"][0]] * 10**7)  # one shared dict: cheap to build here
    with pytest.raises(WireError, match=r"10000\d* inputs, constants and nodes > limit"):
        from_wire(huge)


def test_ten_million_nodes_as_text_are_refused_by_the_body_size() -> None:
    body = b'{"format":"kiln.graph/1","inputs":[],"outputs":[],"nodes":[' + b"{}," * 10**7 + b"{}]}"
    with pytest.raises(WireError, match="body of .* bytes > limit"):
        from_wire(body)


def test_many_tiny_objects_stop_the_parser_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_MAX_NODES", "100")
    body = '{"format":"kiln.graph/1","inputs":[],"outputs":[],"nodes":[' + "{}," * 100_000 + "{}]}"
    with pytest.raises(WireError, match="too many objects"):
        from_wire(body)


def test_shape_with_a_trillion_elements(wire: dict) -> None:
    wire["inputs"][0].update(shape=[10**6, 10**6], stride=[10**6, 1])
    with pytest.raises(WireError, match=r"1000000000000 elements > limit"):
        from_wire(wire)


def test_huge_stride_span_is_refused(wire: dict) -> None:
    wire["inputs"][0]["stride"] = [2**33, 2**33]  # each stride allowed, the span is not
    with pytest.raises(WireError, match="span"):
        from_wire(wire)


def test_factory_op_cannot_allocate_past_the_limit(wire: dict) -> None:
    relu = _node(wire, "aten.relu.default")
    relu.update(op="aten.full.default", args=[[10**6, 10**6], 1.0], kwargs={})
    with pytest.raises(WireError, match=rf"node '{relu['name']}'.*elements > limit"):
        from_wire(wire)


def test_list_returning_op_cannot_explode(wire: dict) -> None:
    relu = _node(wire, "aten.relu.default")
    relu.update(op="aten.full.default", args=[[2**33], 1.0], kwargs={})
    split = {"name": "parts", "op": "aten.split.Tensor", "args": [{"ref": relu["name"]}, 1], "kwargs": {}, "meta": None}
    wire["nodes"].append(split)
    with pytest.raises(WireError, match=r"node 'parts'.*could return 8589934592 tensors"):
        from_wire(wire)


def test_list_ops_on_large_dims_are_accepted() -> None:
    tokens = torch.empty(2**17, 48, device="meta")  # meta: no memory, only metadata
    gm = make_fx(lambda t: torch.split_with_sizes(t, [16, 32], dim=-1)[1] + 1,
                 decomposition_table=decompositions())(tokens)
    assert from_wire(to_wire(gm, [tokens])).op_summary()["aten.split_with_sizes.default"] == 1


def test_deeply_nested_arguments(wire: dict) -> None:
    nested: list = []
    for _ in range(1000):
        nested = [nested]
    _node(wire, "aten.relu.default")["args"].append(nested)
    with pytest.raises(WireError, match="nested deeper than"):
        from_wire(wire)
    with pytest.raises(WireError, match="nested too deeply|nested deeper"):
        from_wire('{"format": "kiln.graph/1", "nodes": ' + "[" * 200_000 + "]" * 200_000 + "}")


@pytest.mark.parametrize("body", [b"\x80\x81\xfe\xff", b"\x00\x01garbage", b"", b"{", "\ud800".encode("utf-8", "surrogatepass")])
def test_non_json_bytes(body: bytes) -> None:
    with pytest.raises(WireError, match="not (valid JSON|UTF-8 JSON)"):
        from_wire(body)


def test_nan_in_a_shape(wire: dict) -> None:
    wire["inputs"][0]["shape"] = [math.nan, 3]
    with pytest.raises(WireError, match=r"shape\[0\] is nan, not an integer"):
        from_wire(wire)
    text = json.dumps(_small_wire()).replace('"shape": [2, 3]', '"shape": [NaN, 3]', 1)
    with pytest.raises(WireError, match="bare NaN is not JSON"):
        from_wire(text)
    tagged = _small_wire()
    tagged["inputs"][0]["shape"] = [{"float": "nan"}, 3]
    with pytest.raises(WireError, match="must be an integer"):
        from_wire(tagged)


def _deep(levels: int) -> list:
    nested: list = []
    for _ in range(levels):
        nested = [nested]
    return nested


@pytest.mark.parametrize("value", [10**5000, -(10**5000), _deep(100_000), [10**5000]],
                         ids=["huge-int", "huge-negative-int", "deep-list", "huge-int-in-list"])
def test_monster_values_from_a_python_caller(wire: dict, value: object) -> None:
    for place in (
        lambda w: w.update(format=value),
        lambda w: w["inputs"][0].update(dtype=value),
        lambda w: w["inputs"][0]["shape"].__setitem__(0, value),
        lambda w: w["nodes"][0]["args"].append(value),
        lambda w: w["nodes"][0]["args"].append({"device": value}),
        lambda w: w["outputs"].append({"ref": value}),
        lambda w: w["nodes"][0].update({value if isinstance(value, int) else "x": 1}),
    ):
        doc = copy.deepcopy(_small_wire())
        place(doc)
        with pytest.raises(WireError):
            from_wire(doc)


def test_meta_that_lies_about_the_result(wire: dict) -> None:
    relu = _node(wire, "aten.relu.default")
    relu["meta"]["shape"] = [1024, 1024]
    with pytest.raises(WireError, match=rf"node '{relu['name']}'.*does not match"):
        from_wire(wire)


def test_op_given_the_wrong_arguments(wire: dict) -> None:
    relu = _node(wire, "aten.relu.default")
    relu["args"] = [{"ref": relu["args"][0]["ref"]}, 5, "x"]
    with pytest.raises(WireError, match=rf"node '{relu['name']}'.*aten.relu.default fails"):
        from_wire(wire)


def test_kwarg_names_must_come_from_the_schema(wire: dict) -> None:
    relu = _node(wire, "aten.relu.default")
    relu["kwargs"] = {"x=__import__('os').system('id'),y": 1}
    with pytest.raises(WireError, match="has no argument"):
        from_wire(wire)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda w: w.update(format="kiln.graph/2"), "format must be"),
        (lambda w: w.update(extra=1), "unknown fields"),
        (lambda w: w.pop("nodes"), "lacks"),
        (lambda w: w["inputs"][0].update(dtype="qint8"), "dtype"),
        (lambda w: w["inputs"][0].update(dtype="object"), "dtype"),
        (lambda w: w["inputs"][0].update(requires_grad="yes"), "requires_grad"),
        (lambda w: w["inputs"][0].update(shape=[2, -3]), "outside"),
        (lambda w: w["inputs"][0].update(shape=[1] * 100, stride=[1] * 100), "rank 100"),
        (lambda w: w["inputs"][1].update(name=w["inputs"][0]["name"]), "defined twice"),
        (lambda w: w["nodes"][0].update(name="bad name!"), "needs a name"),
        (lambda w: w["nodes"][0]["args"].append({"device": "cuda:0"}), "device type"),
        (lambda w: w["nodes"][0]["args"].append({"dtype": "torch.float32"}), "unknown dtype"),
        (lambda w: w["nodes"][0]["args"].append({"float": "NaN"}), "float tag"),
        (lambda w: w["nodes"][0]["args"].append(2**70), "int64"),
        (lambda w: w["nodes"][0]["args"].append({"ref": "a", "dtype": "x"}), "exactly one key"),
        (lambda w: w["outputs"].append({"ref": ["list"]}), "not defined"),
        (lambda w: w.update(constants=[{"name": "c", "dtype": "float32", "shape": [10**6], "data": []}]), "bytes > limit"),
        (lambda w: w.update(constants=[{"name": "c", "dtype": "float32", "shape": [2], "data": [1.0]}]), "must list 2"),
    ],
)
def test_schema_violations_are_named(wire: dict, mutate, message: str) -> None:
    mutate(wire)
    with pytest.raises(WireError, match=message):
        from_wire(wire)


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, wire: dict) -> None:
    monkeypatch.setenv("KILN_MAX_NODES", "3")
    assert limits().max_nodes == 3
    with pytest.raises(WireError, match="> limit 3"):
        from_wire(copy.deepcopy(wire))
    monkeypatch.setenv("KILN_MAX_NODES", "lots")
    with pytest.raises(ValueError, match="KILN_MAX_NODES"):
        limits()


# --- property: any mutation of a valid graph is accepted or refused with a WireError ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_WORDS = ["ref", "dtype", "device", "layout", "memory_format", "float", "name", "op", "args", "kwargs",
          "meta", "shape", "stride", "inputs", "nodes", "outputs", "constants", "data", "format",
          "aten.add.Tensor", "aten.full.default", "aten.split.Tensor", "operator.getitem", "builtins.eval",
          "os.system", "n0", "n1", "n3", "c0", "float32", "int64", "bool", "cuda", "cpu", "nan", "-inf",
          "strided", "channels_last", "kiln.graph/1", "storage_offset", "requires_grad"]
_leaves = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2, 3, 2**31, 2**63 - 1, 10**12]),
    st.just(0).map(lambda _: 10**5000),  # past Python's int-to-str limit
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(_WORDS),
)
_json = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(_WORDS), st.text(max_size=6)), inner, max_size=3),
    ),
    max_leaves=12,
)


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _mutate(doc, data) -> object:
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = data.draw(st.sampled_from(["replace", "delete", "insert", "duplicate", "copy_other", "rename_key"]))
    if action == "replace":
        parent[key] = data.draw(_json)
    elif action == "delete":
        del parent[key]
    elif action == "insert" and isinstance(parent, list):
        parent.insert(key, data.draw(_json))
    elif action == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    elif action == "copy_other":
        other = data.draw(st.sampled_from(paths))
        value = doc
        for k in other:
            value = value[k]
        parent[key] = copy.deepcopy(value)
    elif action == "rename_key" and isinstance(parent, dict):
        parent[data.draw(st.sampled_from(_WORDS))] = parent.pop(key)
    else:
        parent[key] = data.draw(_json)
    return doc


def _enum_graph() -> dict:
    def fn(x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.ops.aten.scalar_tensor.default(1.5, dtype=torch.float32, layout=torch.strided, device="cpu")
        parts = torch.split(x, 2, dim=1)
        picked = torch.index_select(x, 0, idx).clone(memory_format=torch.contiguous_format)
        return parts[0] * y + torch.tensor([0.5, float("-inf")]), picked.sum(dim=[0, 1], keepdim=True)

    x, idx = torch.randn(3, 4), torch.tensor([2, 0])
    return to_wire(make_fx(fn, decomposition_table=decompositions())(x, idx), [x, idx])


_BASES = [_small_wire(), _enum_graph()]


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), base=st.sampled_from(range(len(_BASES))), mutations=st.integers(1, 3), as_text=st.booleans())
def test_mutated_graphs_are_accepted_or_refused_cleanly(data, base: int, mutations: int, as_text: bool) -> None:
    doc: object = copy.deepcopy(_BASES[base])
    for _ in range(mutations):
        if not isinstance(doc, (dict, list)) or not doc:
            break
        doc = _mutate(doc, data)
    obj = doc
    if as_text:
        try:
            obj = json.dumps(doc)  # text may carry bare NaN/Infinity tokens
        except ValueError:  # an int past the str limit has no JSON text: send the dict
            pass
    try:
        graph = from_wire(obj)
    except WireError:
        return
    canonical = graph.to_json()
    assert from_wire(canonical).to_json() == canonical
    graph.to_fx()


def test_parse_json_applies_the_text_checks_to_wrapped_bodies() -> None:
    from compiler.wire.graph import parse_json

    assert parse_json(b'{"graph": {"a": 1}, "target": {}}') == {"graph": {"a": 1}, "target": {}}
    for body, message in ((b'{"a": NaN}', "bare NaN"), (b'{"a": 1, "a": 2}', "repeats a key"),
                          (b"\x80", "not UTF-8"), (b"[" * 100_000, "nested too deeply|not valid JSON")):
        with pytest.raises(WireError, match=message):
            parse_json(body)
