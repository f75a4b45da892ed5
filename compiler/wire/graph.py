"""The kiln.graph/1 wire format: `to_wire`, `from_wire` and the validated `Graph`.

A graph travels as JSON (see docs/wire-format.md). `from_wire` checks every field against
the schema, resolves ops against the aten/prims allowlist, checks the size limits of
`compiler.wire.limits`, and runs the graph on meta tensors to check that every node's
declared result matches what its op gives. Names are canonicalised to positions
(inputs and nodes `n0, n1, ...`, constants `c0, c1, ...`), so the canonical JSON depends
only on the computation.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import fx

from compiler.wire.decode import (
    ConstantSpec,
    GraphSpec,
    InputSpec,
    NodeMeta,
    NodeSpec,
    TensorMeta,
    array_budget,
    check_containers,
    object_budget,
    parse_document,
)
from compiler.wire.encode import encode_graph
from compiler.wire.fx import build_fx, infer_meta
from compiler.wire.limits import WireLimits, limits
from compiler.wire.schema import FORMAT, Ref, ValidationCancelled, WireError, encode_float

__all__ = ["FORMAT", "Graph", "ValidationCancelled", "WireError", "WireIdentity", "from_wire", "identify", "parse_json",
           "to_graph", "to_wire", "to_wire_and_graph"]


class Graph:
    """A validated, immutable kiln.graph/1 graph with canonical names.

    Build one with `from_wire` (or `to_wire` for the dict form); do not call the
    constructor directly.
    """

    def __init__(self, spec: GraphSpec, canonical: dict[str, Any],
                 meta_values: dict[str, Any] | None = None) -> None:
        self._spec = spec
        self._json = canonical
        self._text: str | None = None
        self._meta_values = meta_values or {}  # validation's meta tensors, by name

    @property
    def inputs(self) -> list[InputSpec]:
        """Metadata of each input: `name`, `dtype`, `shape`, `stride`, `storage_offset`,
        `requires_grad`."""
        return list(self._spec.inputs)

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The op calls in topological order (`name`, `op`, `target`, `args`, `kwargs`, `meta`)."""
        return self._spec.nodes

    @property
    def constants(self) -> tuple[ConstantSpec, ...]:
        return self._spec.constants

    @property
    def outputs(self) -> tuple[Ref | None, ...]:
        return self._spec.outputs

    def to_json(self) -> dict[str, Any]:
        """The canonical wire dict (a fresh copy)."""
        return copy.deepcopy(self._json)

    def canonical_text(self) -> str:
        """The canonical JSON text (sorted keys, no whitespace, ASCII) that `graph_hash` hashes."""
        if self._text is None:
            self._text = _canonical_text(self._json)
        return self._text

    def to_fx(self, device: str | torch.device | None = None) -> fx.GraphModule:
        """A runnable aten GraphModule: placeholders in input order, returns a tuple in
        `outputs` order; node names are the canonical names, and `node.meta["wire_meta"]`
        holds each node's checked wire meta, `node.meta["wire_value"]` the meta value that
        validation computed for it (lowering takes it instead of running the op again).
        `device` replaces every device argument (and places constants), e.g. to run a CUDA
        graph on the CPU."""
        gm = build_fx(self._spec, device)
        metas = {n.name: n.meta for n in self._spec.nodes}
        for node in gm.graph.nodes:
            if node.name in metas:
                node.meta["wire_meta"] = metas[node.name]
            if node.name in self._meta_values:
                node.meta["wire_value"] = self._meta_values[node.name]
        return gm

    def op_summary(self) -> dict[str, int]:
        """How many times each op occurs, by wire op name, sorted by name."""
        return _op_summary(self._spec)

    def __repr__(self) -> str:
        return f"Graph({len(self._spec.inputs)} inputs, {len(self._spec.nodes)} nodes)"


def _canonical_names(spec: GraphSpec) -> dict[str, str]:
    names = {inp.name: f"n{i}" for i, inp in enumerate(spec.inputs)}
    names.update({c.name: f"c{i}" for i, c in enumerate(spec.constants)})
    first = len(spec.inputs)
    names.update({n.name: f"n{first + i}" for i, n in enumerate(spec.nodes)})
    return names


def _rename(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, Ref):
        return Ref(names[value.name])
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    return value


def _canonical_spec(spec: GraphSpec, names: dict[str, str]) -> GraphSpec:
    return GraphSpec(
        inputs=tuple(replace(i, name=names[i.name]) for i in spec.inputs),
        constants=tuple(replace(c, name=names[c.name]) for c in spec.constants),
        nodes=tuple(
            replace(
                n,
                name=names[n.name],
                args=tuple(_rename(a, names) for a in n.args),
                kwargs={k: _rename(v, names) for k, v in sorted(n.kwargs.items())},
            )
            for n in spec.nodes
        ),
        outputs=tuple(None if r is None else Ref(names[r.name]) for r in spec.outputs),
    )


def _json_value(value: Any) -> Any:
    if isinstance(value, Ref):
        return {"ref": value.name}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if type(value) is float:
        return encode_float(value)
    if isinstance(value, torch.device):
        return {"device": value.type}
    for tag, kind in (("dtype", torch.dtype), ("layout", torch.layout), ("memory_format", torch.memory_format)):
        if isinstance(value, kind):
            return {tag: str(value).removeprefix("torch.")}
    return value


def _meta_json(meta: NodeMeta) -> Any:
    if isinstance(meta, tuple):
        return [_meta_json(m) for m in meta]
    if meta is None:
        return None
    if type(meta) is int:
        return {"int": meta}
    return meta.to_json()


def _same_meta(declared: NodeMeta, inferred: NodeMeta) -> bool:
    """Equal dtype and shape, and equal strides except along dims of size <= 1 (where a
    stride means nothing and torch versions disagree)."""
    if isinstance(declared, TensorMeta) and isinstance(inferred, TensorMeta):
        return (
            declared.dtype == inferred.dtype
            and declared.shape == inferred.shape
            and all(s <= 1 or a == b for s, a, b in zip(declared.shape, declared.stride, inferred.stride, strict=True))
        )
    if isinstance(declared, tuple) and isinstance(inferred, tuple) and len(declared) == len(inferred):
        return all(_same_meta(d, i) for d, i in zip(declared, inferred, strict=True))
    if type(declared) is int or type(inferred) is int:
        return type(declared) is type(inferred) and declared == inferred
    return declared is None and inferred is None


def _to_json(spec: GraphSpec) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "inputs": [
            {
                "name": i.name,
                "dtype": str(i.dtype).removeprefix("torch."),
                "shape": list(i.shape),
                "stride": list(i.stride),
                "storage_offset": i.storage_offset,
                "requires_grad": i.requires_grad,
            }
            for i in spec.inputs
        ],
        "nodes": [
            {
                "name": n.name,
                "op": n.op,
                "args": [_json_value(a) for a in n.args],
                "kwargs": {k: _json_value(v) for k, v in n.kwargs.items()},
                "meta": _meta_json(n.meta),
            }
            for n in spec.nodes
        ],
        "outputs": [None if r is None else {"ref": r.name} for r in spec.outputs],
        "constants": [
            {
                "name": c.name,
                "dtype": str(c.dtype).removeprefix("torch."),
                "shape": list(c.shape),
                "data": [encode_float(v) if type(v) is float else v for v in c.data],
            }
            for c in spec.constants
        ],
    }


class WireIdentity:
    """A wire graph checked against the schema, the op allowlist and the size limits, with
    its canonical names and text, before any op runs (`identify`): enough to name it
    (`graph_hash`, `tuning_key`) and to find a graph validated before; `validate` runs it."""

    def __init__(self, doc: Any, wire_limits: WireLimits, require_meta: bool,
                 count_containers: bool) -> None:
        # The validation deadline counts parsing too, as it did before the two were split.
        self._deadline = time.monotonic() + wire_limits.max_validation_ms / 1000
        spec = parse_document(doc, wire_limits, require_meta, count_containers)
        names = _canonical_names(spec)
        self._spec = _canonical_spec(spec, names)
        self._display = {new: old for old, new in names.items()}  # canonical -> sent name
        self._limits = wire_limits
        self._require_meta = require_meta
        self._json = _to_json(self._spec)
        self._text: str | None = None

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self._spec.nodes

    def canonical_text(self) -> str:
        """The text `graph_hash` hashes; a validated graph has the same."""
        if self._text is None:
            self._text = _canonical_text(self._json)
        return self._text

    def op_summary(self) -> dict[str, int]:
        return _op_summary(self._spec)

    def validate(self, cancel: threading.Event | None = None) -> Graph:
        """Run every op on meta tensors: each must take its arguments and give the meta it
        declares (without `require_meta`, the metas it gives are taken)."""
        values: dict[str, Any] = {}
        inferred = infer_meta(self._spec, self._display, self._limits, self._deadline, cancel,
                              values)
        nodes = []
        for node in self._spec.nodes:
            meta = inferred.get(node.name)
            declared = node.meta
            if self._require_meta and not _same_meta(declared, meta):
                raise WireError(
                    f"meta {json.dumps(_meta_json(declared))[:200]} does not match what "
                    f"{node.op} gives: {json.dumps(_meta_json(meta))[:200]}",
                    self._display[node.name],
                )
            nodes.append(replace(node, meta=declared if self._require_meta else meta))
        if self._require_meta:  # the declared metas stand: the canonical JSON is the same
            return Graph(replace(self._spec, nodes=tuple(nodes)), self._json, values)
        canonical = replace(self._spec, nodes=tuple(nodes))
        return Graph(canonical, _to_json(canonical), values)


def identify(obj: dict[str, Any]) -> WireIdentity:
    """`obj` named without running it: `compiler.graph_hash` and `compiler.tuning_key` of
    the result are `from_wire(obj)`'s, but nothing checks yet that its ops take their
    arguments or give their declared metas. For finding a graph validated before (the same
    canonical text passes the same checks: a service's known graphs); anything new is
    checked with `validate()`. Raises `WireError` for what fails the checks it makes."""
    if not isinstance(obj, dict):
        raise WireError(f"a graph is a JSON object, not {type(obj).__name__}")
    return WireIdentity(obj, limits(), require_meta=True, count_containers=True)


def _build(doc: Any, wire_limits: WireLimits, require_meta: bool,
           cancel: threading.Event | None = None, count_containers: bool = False) -> Graph:
    return WireIdentity(doc, wire_limits, require_meta, count_containers).validate(cancel)


def _canonical_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def _op_summary(spec: GraphSpec) -> dict[str, int]:
    return dict(sorted(Counter(n.op for n in spec.nodes).items()))


def parse_json(body: str | bytes | bytearray, max_bytes: int | None = None) -> Any:
    """Decode a request body the way `from_wire` decodes graph text: size limit, UTF-8,
    no bare NaN/Infinity, no repeated keys, a bounded number of objects and arrays;
    WireError otherwise. For services that receive a graph wrapped in a larger JSON
    document; `max_bytes` replaces the body limit (the service checks its own, a little
    larger, as the body arrives)."""
    wire_limits = limits()
    if max_bytes is not None:
        wire_limits = replace(wire_limits, max_body_bytes=max_bytes)
    return _decode_text(body, wire_limits)


def _decode_text(obj: str | bytes | bytearray, wire_limits: WireLimits) -> Any:
    size = len(obj.encode("utf-8", "surrogatepass")) if isinstance(obj, str) else len(obj)
    if size > wire_limits.max_body_bytes:
        raise WireError(f"graph body of {size} bytes > limit {wire_limits.max_body_bytes}")
    if isinstance(obj, (bytes, bytearray)):
        try:
            obj = bytes(obj).decode("utf-8")
        except UnicodeDecodeError as e:
            raise WireError(f"graph body is not UTF-8 JSON (byte {e.start}); pickles and binary bodies are refused") from None

    def refuse_constant(name: str) -> Any:
        raise WireError(f'bare {name} is not JSON; write non-finite floats as {{"float": "nan"|"inf"|"-inf"}}')

    # Arrays have no parser hook: '[' outside strings bounds them from above, and a graph's
    # strings (names, op names, short arguments) almost never hold one.
    arrays = obj.count("[")
    if arrays > array_budget(wire_limits):
        raise WireError(f"graph JSON holds {arrays} arrays, too many for {wire_limits.max_nodes} nodes")
    # Count objects while parsing, so a body of millions of tiny objects stops early
    # instead of building them all before the node limit is checked.
    budget = [object_budget(wire_limits)]

    def count_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        budget[0] -= 1
        if budget[0] < 0:
            raise WireError(f"graph JSON holds too many objects for {wire_limits.max_nodes} nodes")
        obj = dict(pairs)
        if len(obj) != len(pairs):
            raise WireError(f"graph JSON repeats a key in one object: {sorted(k for k, _ in pairs)[:8]}")
        return obj

    try:
        return json.loads(obj, parse_constant=refuse_constant, object_pairs_hook=count_object)
    except WireError:
        raise
    except RecursionError:
        raise WireError("graph JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and over-long integer literals
        raise WireError(f"graph body is not valid JSON: {str(e)[:200]}") from None


def from_wire(obj: dict[str, Any] | str | bytes | bytearray, *,
              cancel: threading.Event | None = None) -> Graph:
    """Parse and validate a kiln.graph/1 document (a dict, JSON text or UTF-8 bytes).

    Raises `WireError` (a ValueError) naming the node and the reason for anything that
    does not conform: schema, op allowlist, references and order, size limits, the work
    budget of validation (`max_validation_cost` before anything runs, `max_validation_ms`
    while it runs), or a declared meta that does not match what the op gives. With
    `cancel`, setting the event stops validation between two nodes with
    `ValidationCancelled` (a service does so when its client goes away).
    """
    wire_limits = limits()
    if isinstance(obj, (str, bytes, bytearray)):
        obj = _decode_text(obj, wire_limits)
    elif isinstance(obj, dict):
        return _build(obj, wire_limits, require_meta=True, cancel=cancel, count_containers=True)
    else:
        raise WireError(f"from_wire takes a dict, JSON text or bytes, not {type(obj).__name__}")
    return _build(obj, wire_limits, require_meta=True, cancel=cancel)


def to_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Graph:
    """`from_wire(to_wire(gm, example_inputs))` without checking the graph twice."""
    wire_limits = limits()
    return _build(encode_graph(gm, example_inputs, wire_limits), wire_limits, require_meta=False)


def to_wire_and_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]
                      ) -> tuple[dict[str, Any], Graph]:
    """`(w, from_wire(w))` for `w = to_wire(gm, example_inputs)`, running the graph on meta
    tensors once instead of twice: `to_graph` already infers each node's meta, which is the
    meta `w` declares, so `from_wire`'s second run could only find it equal. The document
    still passes every check `from_wire` applies to a dict (the object and array budgets
    too), and the graph is the one `from_wire` returns: same canonical JSON, hash and
    tuning key (tests/compiler/test_wire_fast_path.py checks it on the corpus). For a
    process that converts its own graphs (the client); a graph from elsewhere goes through
    `from_wire`. Raises `WireError` as `to_wire` and `from_wire` do."""
    wire_limits = limits()
    graph = to_graph(gm, example_inputs)
    wire = graph.to_json()
    check_containers(wire, wire_limits)
    return wire, graph


def to_wire(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[str, Any]:
    """The canonical kiln.graph/1 dict of an aten GraphModule (from AOTAutograd or make_fx).

    `example_inputs` gives each placeholder's dtype, shape, stride, storage offset and
    requires_grad: tensors, or descriptions with those fields (e.g. `Graph.inputs`). Raises `WireError` naming the node when the graph cannot travel
    (a non-aten op, a symbolic shape, an unsupported argument, a limit passed).
    """
    return to_graph(gm, example_inputs).to_json()
