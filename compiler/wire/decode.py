"""Parsing and validation of kiln.graph/1 documents into plain, checked specs.

`parse_document` checks the structure of every field (types, names, references, topological
order, size limits) and resolves ops against the allowlist. It never builds anything
large before the counts and sizes have been checked.
"""

from __future__ import annotations

import keyword
import math
from dataclasses import dataclass
from typing import Any

import torch

from compiler.wire.limits import WireLimits
from compiler.wire.schema import (
    DTYPES,
    FORMAT,
    GETITEM,
    INT64_MAX,
    Ref,
    WireError,
    arg_names,
    brief,
    decode_float,
    decode_value,
    meta_cost,
    resolve_op,
    storage_extent,
    valid_name,
)

# dtypes a graph input, result or constant may have (no quantized or bit-packed types).
TENSOR_DTYPES = frozenset({
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "int64", "int32", "int16", "int8", "uint8", "bool", "complex64", "complex128",
})


@dataclass(frozen=True)
class TensorMeta:
    """dtype, shape and stride of one tensor."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": str(self.dtype).removeprefix("torch."),
            "shape": list(self.shape),
            "stride": list(self.stride),
        }


# A node's result: one tensor, several (some possibly None, or static ints such as the
# max sequence lengths flash attention returns), an int picked out of those, or nothing.
ResultMeta = TensorMeta | int | None
NodeMeta = ResultMeta | tuple[ResultMeta, ...]


@dataclass(frozen=True)
class InputSpec:
    """One graph input (a placeholder): parameters and buffers are inputs too."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    requires_grad: bool

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(self.dtype, self.shape, self.stride)


@dataclass(frozen=True)
class ConstantSpec:
    """A small tensor carried inline, row-major."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    data: tuple[Any, ...]

    def tensor(self, device: str | torch.device = "cpu") -> torch.Tensor:
        return torch.tensor(list(self.data), dtype=self.dtype, device=device).reshape(self.shape)


@dataclass(frozen=True)
class NodeSpec:
    """One op call: `target(*args, **kwargs)`; `Ref`s inside args name earlier values."""

    name: str
    op: str
    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    meta: NodeMeta


@dataclass(frozen=True)
class GraphSpec:
    inputs: tuple[InputSpec, ...]
    constants: tuple[ConstantSpec, ...]
    nodes: tuple[NodeSpec, ...]
    outputs: tuple[Ref | None, ...]


def _expect(cond: bool, reason: str, node: str | None = None) -> None:
    if not cond:
        raise WireError(reason, node)


def _keys(obj: object, required: set[str], optional: set[str], where: str, node: str | None = None) -> dict:
    _expect(type(obj) is dict, f"{where} must be a JSON object, got {type(obj).__name__}", node)
    keys = set(obj)
    missing, unknown = required - keys, keys - required - optional
    _expect(not missing, f"{where} lacks {sorted(missing)}", node)
    _expect(not unknown, f"{where} has unknown fields {sorted(brief(k) for k in unknown)[:5]}", node)
    return obj


def _int(value: object, what: str, node: str | None, low: int = 0, high: int = INT64_MAX) -> int:
    if type(value) is float and not math.isfinite(value):
        raise WireError(f"{what} is {brief(value)}, not an integer", node)
    _expect(type(value) is int, f"{what} must be an integer, got {type(value).__name__}", node)
    if not low <= value <= high:
        raise WireError(f"{what} = {brief(value)} is outside [{low}, {high}]", node)
    return value


def _dtype(value: object, node: str | None) -> torch.dtype:
    _expect(
        isinstance(value, str) and value in TENSOR_DTYPES,
        f"tensor dtype {brief(value)} is not supported (one of {sorted(TENSOR_DTYPES)})",
        node,
    )
    return DTYPES[value]


def _dims(value: object, what: str, node: str | None, limits: WireLimits) -> tuple[int, ...]:
    _expect(type(value) is list, f"{what} must be a list of integers", node)
    _expect(len(value) <= limits.max_rank, f"{what} has rank {len(value)} > limit {limits.max_rank}", node)
    return tuple(_int(v, f"{what}[{i}]", node, 0, limits.max_numel) for i, v in enumerate(value))


def _check_extent(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, node: str | None, limits: WireLimits) -> None:
    numel = math.prod(shape)
    _expect(numel <= limits.max_numel, f"shape {list(shape)} has {numel} elements > limit {limits.max_numel}", node)
    if numel:
        extent = storage_extent(shape, stride, offset)
        _expect(extent <= limits.max_numel, f"strides {list(stride)} span {extent} elements > limit {limits.max_numel}", node)


def parse_tensor_meta(obj: object, node: str | None, limits: WireLimits) -> TensorMeta:
    """A `{"dtype", "shape", "stride"}` object, checked against the limits."""
    _keys(obj, {"dtype", "shape", "stride"}, set(), "meta", node)
    dtype = _dtype(obj["dtype"], node)
    shape = _dims(obj["shape"], "meta shape", node, limits)
    stride = _dims(obj["stride"], "meta stride", node, limits)
    _expect(len(shape) == len(stride), "meta shape and stride differ in rank", node)
    _check_extent(shape, stride, 0, node, limits)
    return TensorMeta(dtype, shape, stride)


def _parse_result_meta(obj: object, node: str, limits: WireLimits) -> ResultMeta:
    if obj is None:
        return None
    if type(obj) is dict and set(obj) == {"int"}:
        return _int(obj["int"], "meta int", node, -INT64_MAX - 1)
    return parse_tensor_meta(obj, node, limits)


def parse_node_meta(obj: object, node: str, limits: WireLimits) -> NodeMeta:
    """A node's meta: a tensor meta, `{"int": v}`, null, or a list of those."""
    if type(obj) is list:
        _expect(len(obj) <= limits.max_nodes, "meta lists more results than the node limit", node)
        return tuple(_parse_result_meta(m, node, limits) for m in obj)
    return _parse_result_meta(obj, node, limits)


def _parse_input(obj: object, index: int, limits: WireLimits) -> InputSpec:
    fields = {"name", "dtype", "shape", "stride", "storage_offset", "requires_grad"}
    _keys(obj, fields, set(), f"inputs[{index}]")
    name = obj["name"]
    dtype = _dtype(obj["dtype"], name)
    shape = _dims(obj["shape"], "shape", name, limits)
    stride = _dims(obj["stride"], "stride", name, limits)
    _expect(len(shape) == len(stride), "shape and stride differ in rank", name)
    offset = _int(obj["storage_offset"], "storage_offset", name, 0, limits.max_numel)
    _check_extent(shape, stride, offset, name, limits)
    _expect(type(obj["requires_grad"]) is bool, "requires_grad must be true or false", name)
    return InputSpec(name, dtype, shape, stride, offset, obj["requires_grad"])


def _parse_constant(obj: object, index: int, limits: WireLimits) -> ConstantSpec:
    _keys(obj, {"name", "dtype", "shape", "data"}, set(), f"constants[{index}]")
    name = obj["name"]
    dtype = _dtype(obj["dtype"], name)
    _expect(not dtype.is_complex, "complex constants are not supported", name)
    shape = _dims(obj["shape"], "shape", name, limits)
    numel = math.prod(shape)
    _expect(numel * dtype.itemsize <= limits.max_constant_bytes, f"constant of {numel * dtype.itemsize} bytes > limit {limits.max_constant_bytes}", name)
    data = obj["data"]
    _expect(type(data) is list and len(data) == numel, f"data must list {numel} values (row-major)", name)
    if dtype == torch.bool:
        _expect(all(type(v) is bool for v in data), "bool constant data must be true/false", name)
        return ConstantSpec(name, dtype, shape, tuple(data))
    if dtype.is_floating_point:
        values = []
        for v in data:
            f = float(v) if type(v) is int else decode_float(v)
            _expect(f is not None, f"float constant data holds {brief(v)}", name)
            values.append(f)
        return ConstantSpec(name, dtype, shape, tuple(values))
    info = torch.iinfo(dtype)
    return ConstantSpec(name, dtype, shape, tuple(_int(v, "constant value", name, info.min, info.max) for v in data))


def _collect_names(doc: dict, limits: WireLimits) -> dict[str, int]:
    """Every defined name with its position in definition order (inputs, constants, nodes)."""
    order: dict[str, int] = {}
    for section in ("inputs", "constants", "nodes"):
        for i, entry in enumerate(doc[section]):
            name = entry.get("name") if type(entry) is dict else None
            _expect(valid_name(name, limits.max_name_chars), f"{section}[{i}] needs a name: letters, digits, _ (at most {limits.max_name_chars})")
            _expect(name not in order, f"name {name!r} is defined twice", name)
            order[name] = len(order)
    return order


def _check_refs(value: Any, node: str, position: int, order: dict[str, int]) -> None:
    if isinstance(value, Ref):
        where = order.get(value.name)
        _expect(where is not None, f"refers to {value.name!r}, which is not defined", node)
        _expect(where != position, "refers to itself", node)
        _expect(where < position, f"refers to {value.name!r}, which comes later (nodes must be in topological order; cycles are not allowed)", node)
    elif type(value) is list:
        for v in value:
            _check_refs(v, node, position, order)


def _parse_node(obj: object, index: int, position: int, order: dict[str, int], limits: WireLimits, require_meta: bool) -> NodeSpec:
    required = {"name", "op", "args", "kwargs"} | ({"meta"} if require_meta else set())
    _keys(obj, required, {"meta"}, f"nodes[{index}]")
    name = obj["name"]
    try:
        target = resolve_op(obj["op"])
    except WireError as e:
        raise WireError(e.reason, name) from None
    _expect(type(obj["args"]) is list, "args must be a list", name)
    _expect(type(obj["kwargs"]) is dict, "kwargs must be an object", name)
    _expect(all(type(k) is str for k in obj["kwargs"]), "kwargs keys must be strings", name)
    try:
        args = tuple(decode_value(a, 0, limits.max_nesting, limits.max_str_chars) for a in obj["args"])
        kwargs = {k: decode_value(v, 0, limits.max_nesting, limits.max_str_chars) for k, v in obj["kwargs"].items()}
    except WireError as e:
        raise WireError(e.reason, name) from None
    except RecursionError:
        raise WireError("arguments nested too deeply", name) from None
    if obj["op"] == GETITEM:
        _expect(len(args) == 2 and isinstance(args[0], Ref) and type(args[1]) is int and not kwargs,
                "operator.getitem takes (ref, int index) and no kwargs", name)
    else:
        unknown = sorted(set(kwargs) - arg_names(target))
        if unknown:
            raise WireError(f"{obj['op']} has no argument {unknown[0][:40]!r}", name)
        # fx writes kwargs as `name=value` into the Python source of to_fx(): a keyword such
        # as `from` (aten.uniform) would be a SyntaxError there; it travels positionally.
        reserved = sorted(k for k in kwargs if keyword.iskeyword(k))
        if reserved:
            raise WireError(f"kwarg {reserved[0]!r} is a Python keyword; pass it positionally", name)
    _check_refs(list(args) + list(kwargs.values()), name, position, order)
    meta = parse_node_meta(obj["meta"], name, limits) if "meta" in obj else None
    return NodeSpec(name, obj["op"], target, args, kwargs, meta)


def object_budget(limits: WireLimits) -> int:
    """How many JSON objects a document may hold for the node limit."""
    return 16 * limits.max_nodes + 1024


def array_budget(limits: WireLimits) -> int:
    """How many JSON arrays a document may hold for the node limit."""
    return 64 * limits.max_nodes + 1024


def check_containers(doc: dict, limits: WireLimits) -> None:
    """The object and array budgets that decoding text applies, for a document given as a
    dict (a loop, so that no nesting depth can break it)."""
    objects, arrays = 0, 0
    todo: list[Any] = [doc]
    while todo:
        value = todo.pop()
        if type(value) is dict:
            objects += 1
            todo.extend(v for v in value.values() if type(v) in (dict, list))
        else:
            arrays += 1
            todo.extend(v for v in value if type(v) in (dict, list))
        if objects > object_budget(limits) or arrays > array_budget(limits):
            raise WireError(f"graph holds more than {object_budget(limits)} objects or "
                            f"{array_budget(limits)} arrays, too many for {limits.max_nodes} nodes")


def _check_cost(nodes: list, limits: WireLimits) -> None:
    """Refuse, before any op runs, a graph whose validation would cost more than the budget
    (a few hundred bytes of one slow op repeated would otherwise cost minutes of CPU)."""
    ops = [n["op"] for n in nodes if type(n) is dict and isinstance(n.get("op"), str)]
    cost = sum(meta_cost(op) for op in ops)
    if cost > limits.max_validation_cost:
        dearest = max(ops, key=meta_cost)
        raise WireError(
            f"validating this graph would cost {cost} units > limit {limits.max_validation_cost} "
            f"(KILN_MAX_VALIDATION_COST; one {dearest} costs {meta_cost(dearest)}, a cheap op 1)")


def parse_document(doc: object, limits: WireLimits, require_meta: bool = True,
                   count_containers: bool = False) -> GraphSpec:
    """Check a decoded JSON document against the kiln.graph/1 schema; WireError if not valid.

    With `require_meta=False` (used by `to_wire`) nodes may omit `meta`; it is then inferred.
    With `count_containers` (a document that did not come from text, whose decoding counts
    them), the object and array budgets are applied after the section counts.
    """
    _keys(doc, {"format", "inputs", "nodes", "outputs"}, {"constants"}, "graph")
    _expect(doc["format"] == FORMAT, f"format must be {FORMAT!r}, got {brief(doc['format'])}")
    doc = {**doc, "constants": doc.get("constants", [])}
    for section in ("inputs", "nodes", "outputs", "constants"):
        _expect(type(doc[section]) is list, f"{section} must be a list")
    count = len(doc["inputs"]) + len(doc["nodes"]) + len(doc["constants"])
    _expect(count <= limits.max_nodes, f"graph has {count} inputs, constants and nodes > limit {limits.max_nodes}")
    _expect(len(doc["outputs"]) <= limits.max_nodes, f"graph has {len(doc['outputs'])} outputs > limit {limits.max_nodes}")
    if count_containers:
        check_containers(doc, limits)
    _check_cost(doc["nodes"], limits)
    order = _collect_names(doc, limits)
    inputs = tuple(_parse_input(obj, i, limits) for i, obj in enumerate(doc["inputs"]))
    constants = tuple(_parse_constant(obj, i, limits) for i, obj in enumerate(doc["constants"]))
    total = sum(math.prod(c.shape) * c.dtype.itemsize for c in constants)
    _expect(total <= limits.max_constant_bytes, f"constants hold {total} bytes > limit {limits.max_constant_bytes}")
    first = len(inputs) + len(constants)
    nodes = tuple(
        _parse_node(obj, i, first + i, order, limits, require_meta) for i, obj in enumerate(doc["nodes"])
    )
    outputs = []
    for i, out in enumerate(doc["outputs"]):
        if out is None:
            outputs.append(None)
            continue
        _keys(out, {"ref"}, set(), f"outputs[{i}]")
        _expect(isinstance(out["ref"], str) and out["ref"] in order, f"outputs[{i}] refers to {brief(out['ref'])}, which is not defined")
        outputs.append(Ref(out["ref"]))
    return GraphSpec(inputs, constants, nodes, tuple(outputs))
