"""Vocabulary of the kiln.graph/1 wire format: errors, references, enum tables, ops, values.

Everything a client sends is matched against fixed tables built from torch at import
time (dtypes, layouts, memory formats, device types) or resolved by walking the
`torch.ops.aten` / `torch.ops.prims` namespaces with a strict identifier check. Nothing
a client sends is ever imported, evaluated or unpickled.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import reprlib
from dataclasses import dataclass
from typing import Any

import torch

FORMAT = "kiln.graph/1"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class WireError(ValueError):
    """A wire graph that kiln refuses; the message names the node (when one is at fault)
    and the reason."""

    def __init__(self, reason: str, node: str | None = None) -> None:
        self.reason = reason
        self.node = node
        super().__init__(f"node {node!r}: {reason}" if node is not None else reason)


class ValidationCancelled(Exception):
    """Validation was stopped from outside (the client that sent the graph went away)."""


@dataclass(frozen=True)
class Ref:
    """A reference to an input, a node or a constant, by name."""

    name: str


def _named(kind: type) -> dict[str, Any]:
    """torch's public values of one type, by canonical name (`float32`, `strided`, ...)."""
    table = {}
    for attr in dir(torch):
        value = getattr(torch, attr, None)
        if isinstance(value, kind):
            table[str(value).removeprefix("torch.")] = value
    return table


DTYPES: dict[str, torch.dtype] = _named(torch.dtype)
LAYOUTS: dict[str, torch.layout] = _named(torch.layout)
MEMORY_FORMATS: dict[str, torch.memory_format] = _named(torch.memory_format)
# The device index never travels: eight ranks of one job share one graph.
DEVICE_TYPES = frozenset({"cpu", "cuda", "meta", "xpu", "mps"})

ENUM_KEYS = {"dtype": DTYPES, "layout": LAYOUTS, "memory_format": MEMORY_FORMATS}
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

GETITEM = "operator.getitem"
# aten ops that reach outside the graph: read or write files, print, warn, touch streams.
_SIDE_EFFECTS = frozenset({
    "from_file", "save", "_print", "warn", "record_stream", "pin_memory", "_pin_memory",
})
# Ops without a tensor result that traced graphs legitimately hold.
_ASSERTS = frozenset({"_assert_async", "_assert_scalar", "_assert_tensor_metadata"})
_NAMESPACES = {"aten": torch.ops.aten, "prims": torch.ops.prims}
# Ops whose meta execution runs a Python decomposition many times slower than a cheap op:
# price in units of a cheap op (about 0.1 ms), measured on meta tensors (torch 2.13, one
# core) and rounded up. `meta_cost` prices the backward of each the same.
_META_PRICES = {
    "upsample_bicubic2d": 500, "upsample_trilinear3d": 150, "upsample_bilinear2d": 80,
    "upsample_linear1d": 40, "grid_sampler_2d": 150, "grid_sampler_3d": 300,
    "native_layer_norm": 10, "im2col": 10, "col2im": 10,
}


def meta_cost(op: str) -> int:
    """The estimated cost of validating one node of wire op `op` on meta tensors, in units
    of a cheap op: what the validation budget (`max_validation_cost`) counts."""
    packet = op.split(".")[1] if op.count(".") == 2 else op
    return _META_PRICES.get(packet.removesuffix("_backward"), 1)
_OP_RE = re.compile(r"(aten|prims)\.([A-Za-z][A-Za-z0-9_]*|_[A-Za-z0-9][A-Za-z0-9_]*)\.([A-Za-z][A-Za-z0-9_]*)")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def valid_name(name: object, max_chars: int) -> bool:
    """Whether `name` may name an input, node or constant."""
    return (
        isinstance(name, str) and len(name) <= max_chars and _NAME_RE.fullmatch(name) is not None
    )


def op_name(target: Any) -> str:
    """The wire name of an fx call target (`aten.add.Tensor`); WireError if not allowed."""
    if target is operator.getitem:
        return GETITEM
    if isinstance(target, torch._ops.OpOverload):
        namespace, _, packet = target._schema.name.partition("::")
        name = f"{namespace}.{packet}.{target._overloadname}"
        if namespace not in _NAMESPACES or not _OP_RE.fullmatch(name):
            raise WireError(f"op {name} is outside the aten and prims namespaces")
        resolve_op(name)  # the same allowlist the receiver applies
        return name
    if isinstance(target, torch._ops.OpOverloadPacket):
        raise WireError(f"op {target} is an overload packet; trace to aten overloads (make_fx)")
    raise WireError(f"call target {getattr(target, '__name__', type(target).__name__)!s} is not an aten or prims op")


def resolve_op(name: object) -> Any:
    """The OpOverload (or `operator.getitem`) a wire op name denotes; WireError otherwise.

    Only `aten.*.*`, `prims.*.*` and `operator.getitem` are accepted; the packet is looked
    up as an attribute of the fixed namespace object after a strict identifier check, so
    no client text reaches an import or an eval.
    """
    if not isinstance(name, str):
        raise WireError(f"op must be a string, got {type(name).__name__}")
    if name == GETITEM:
        return operator.getitem
    match = _OP_RE.fullmatch(name) if len(name) <= 256 else None
    if match is None:
        raise WireError(
            f"op {name[:80]!r} is not allowed (only aten.<op>.<overload>, "
            "prims.<op>.<overload> and operator.getitem)"
        )
    return _resolve_checked(*match.groups())


@functools.cache
def arg_names(target: Any) -> frozenset[str]:
    """The names of an op's schema arguments (asked for every node of every graph)."""
    return frozenset(a.name for a in target._schema.arguments)


@functools.lru_cache(maxsize=4096)
def _resolve_checked(namespace: str, packet_name: str, overload_name: str) -> torch._ops.OpOverload:
    name = f"{namespace}.{packet_name}.{overload_name}"
    try:
        packet = getattr(_NAMESPACES[namespace], packet_name)
    except (AttributeError, RuntimeError):
        packet = None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        raise WireError(f"op {name} does not exist in this torch build")
    if overload_name not in packet.overloads():
        raise WireError(f"op {name}: {namespace}.{packet_name} has no overload {overload_name!r}")
    overload = getattr(packet, overload_name)
    if not isinstance(overload, torch._ops.OpOverload):
        raise WireError(f"op {name} is not an OpOverload")
    if packet_name in _SIDE_EFFECTS or packet_name.startswith("_test_"):
        raise WireError(f"op {name} acts outside the graph (files, logs, streams) and is refused")
    returns_tensor = any("Tensor" in str(r.type) for r in overload._schema.returns)
    if not returns_tensor and packet_name not in _ASSERTS:
        # TorchScript builtins (string and list ops) and data-dependent scalars (item, Int).
        raise WireError(f"op {name} returns no tensor; only tensor ops travel")
    return overload


_BRIEF = reprlib.Repr()  # keyword arguments only from Python 3.12
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxstring, _BRIEF.maxother = 3, 4, 4, 40, 40


def brief(value: object) -> str:
    """A short, safe rendering of a client value for error messages (never raises)."""
    if type(value) is int and value.bit_length() > 64:
        return f"<{value.bit_length()}-bit integer>"
    try:
        return _BRIEF.repr(value)
    except Exception:  # huge ints inside containers, exotic objects from a Python caller
        return f"<{type(value).__name__}>"


def check_str(value: str, max_str: int) -> str:
    """A string argument as it may travel: bounded, and printable (no control, format or
    line-separator characters), so that no client string can forge a log line or carry
    terminal escapes when an op echoes it (e.g. `aten._assert_async.msg`)."""
    if len(value) > max_str:
        raise WireError(f"string argument longer than {max_str} characters")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise WireError(f"string argument holds the non-printable character {bad!r}")
    return value


def _is_str_in(value: object, table: Any) -> bool:
    return isinstance(value, str) and value in table


def encode_float(value: float) -> float | dict[str, str]:
    """A float as JSON: a number when finite, `{"float": "nan"|"inf"|"-inf"}` otherwise."""
    if math.isnan(value):
        return {"float": "nan"}
    if math.isinf(value):
        return {"float": "inf" if value > 0 else "-inf"}
    return value


def decode_float(value: object) -> float | None:
    """The float a JSON value encodes, or None when it is not a float encoding."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is dict and len(value) == 1 and _is_str_in(value.get("float"), NON_FINITE):
        return NON_FINITE[value["float"]]
    return None


_NOT_PLAIN = object()  # `_plain_scalar`'s answer for a value it does not cover


def _plain_scalar(value: Any, max_str: int) -> Any:
    """None, a bool, an int64 or a bounded printable string, checked: a value that travels
    as itself both ways (floats do not: a non-finite one is tagged); `_NOT_PLAIN` otherwise."""
    if value is None or type(value) is bool:
        return value
    if type(value) is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise WireError(f"integer argument {brief(value)} does not fit in int64")
        return value
    if type(value) is str:
        return check_str(value, max_str)
    return _NOT_PLAIN


def encode_value(value: Any, names: dict[Any, str], max_str: int) -> Any:
    """An fx argument as a wire value; `names` maps fx nodes to their wire names."""
    plain = _plain_scalar(value, max_str)
    if plain is not _NOT_PLAIN:
        return plain
    if type(value) is float:
        return encode_float(value)
    if isinstance(value, (list, tuple)):
        return [encode_value(v, names, max_str) for v in value]
    if isinstance(value, torch.fx.Node):
        return {"ref": names[value]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise WireError("symbolic sizes are not supported; trace with static shapes")
    raise WireError(f"argument of type {type(value).__name__} is not supported on the wire")


def decode_value(value: Any, depth: int, max_depth: int, max_str: int) -> Any:
    """A wire value as a Python argument (`Ref` for references); WireError if malformed."""
    plain = _plain_scalar(value, max_str)
    if plain is not _NOT_PLAIN:
        return plain
    if type(value) is float:
        if not math.isfinite(value):
            raise WireError('non-finite float must be written {"float": "nan"|"inf"|"-inf"}')
        return value
    if type(value) is list:
        if depth >= max_depth:
            raise WireError(f"arguments nested deeper than {max_depth} levels")
        return [decode_value(v, depth + 1, max_depth, max_str) for v in value]
    if type(value) is dict:
        return _decode_tagged(value)
    raise WireError(f"argument of type {type(value).__name__} is not a wire value")


def _decode_tagged(value: dict) -> Any:
    if len(value) != 1:
        raise WireError(f"tagged value must have exactly one key, got {sorted(brief(k) for k in value)[:5]}")
    (tag, payload), = value.items()
    if tag == "ref":
        if not isinstance(payload, str):
            raise WireError("a reference must name a node: {\"ref\": \"<name>\"}")
        return Ref(payload)
    if tag == "float":
        if not _is_str_in(payload, NON_FINITE):
            raise WireError(f"float tag accepts 'nan', 'inf', '-inf', got {brief(payload)}")
        return NON_FINITE[payload]
    if tag == "device":
        if not _is_str_in(payload, DEVICE_TYPES):
            raise WireError(f"unknown device type {brief(payload)} (expected one of {sorted(DEVICE_TYPES)})")
        return torch.device(payload)
    table = ENUM_KEYS.get(tag)
    if table is None:
        raise WireError(f"unknown tagged value {brief(tag)}")
    if not isinstance(payload, str) or payload not in table:
        raise WireError(f"unknown {tag} {brief(payload)}")
    return table[payload]


def storage_extent(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> int:
    """Storage elements a strided tensor reaches: its offset plus the span of its last
    element (just the offset when it has no elements)."""
    if math.prod(shape) == 0:
        return offset
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))
