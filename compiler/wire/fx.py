"""Rebuild an fx GraphModule from checked wire specs, and infer every node's meta.

Meta inference runs the graph on `meta` tensors (no data, no memory), forcing every
factory op onto the meta device, so a hostile graph can never allocate: each node's
result is checked against the size limits before the next node runs.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn
from torch.fx._lazy_graph_module import _LazyGraphModule

from compiler.wire import device_layout
from compiler.wire.decode import GraphSpec, NodeMeta, NodeSpec, TensorMeta
from compiler.wire.limits import WireLimits
from compiler.wire.memo import MAX_LIST, Memo, plain_value
from compiler.wire.schema import (
    GETITEM,
    Ref,
    ValidationCancelled,
    WireError,
    arg_names,
    storage_extent,
)

_META = torch.device("meta")
# Ops returning a list whose length is ceil(size / split_size) rather than bounded by args.
_SPLIT_OPS = frozenset({"aten.split.Tensor", "aten.unsafe_split.Tensor", "aten.split_copy.Tensor"})


def build_fx(spec: GraphSpec, device: str | torch.device | None = None) -> fx.GraphModule:
    """An fx GraphModule computing `spec`; placeholders in input order, tuple output.

    `device` (optional) replaces every device argument and places the constants there;
    None keeps the devices the wire names (constants on the CPU).
    """
    override = torch.device(device) if device is not None else None
    graph = fx.Graph()
    root = nn.Module()
    env: dict[str, fx.Node] = {}
    for inp in spec.inputs:
        env[inp.name] = graph.placeholder(inp.name)
    for const in spec.constants:
        root.register_buffer(const.name, const.tensor(override or "cpu"))
        env[const.name] = graph.get_attr(const.name)

    def resolve(value: Any) -> Any:
        if isinstance(value, Ref):
            return env[value.name]
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if override is not None and isinstance(value, torch.device):
            return override
        return value

    for node in spec.nodes:
        args = tuple(resolve(a) for a in node.args)
        kwargs = {k: resolve(v) for k, v in node.kwargs.items()}
        if override is not None and node.op != GETITEM and "device" in arg_names(node.target):
            kwargs.setdefault("device", override)  # factory ops default to the CPU otherwise
        env[node.name] = graph.create_node("call_function", node.target, args, kwargs, name=node.name)
    graph.output(tuple(env[r.name] if r is not None else None for r in spec.outputs))
    # Lazy: its Python code is generated when first read or called (a run, a debug print),
    # not here and at each `recompile()` of lowering's passes, which never need it.
    return _LazyGraphModule(root, graph)


def _result_meta(value: Any, node: str, limits: WireLimits) -> NodeMeta:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return _tensor_meta(value, node, limits)
    if type(value) is int:  # a static int picked out of a multi-result op
        return value
    if isinstance(value, (list, tuple)):
        return tuple(None if v is None else v if type(v) is int else _tensor_meta(v, node, limits) for v in value)
    raise WireError(f"returns a {type(value).__name__}, not tensors (data-dependent ops are not supported)", node)


def _tensor_meta(value: Any, node: str, limits: WireLimits) -> TensorMeta:
    if not isinstance(value, torch.Tensor):
        raise WireError(f"returns a {type(value).__name__} among its results", node)
    if value.dim() > limits.max_rank:
        raise WireError(f"result has rank {value.dim()} > limit {limits.max_rank}", node)
    if value.numel() > limits.max_numel:
        raise WireError(f"result has {value.numel()} elements > limit {limits.max_numel}", node)
    return TensorMeta(value.dtype, tuple(value.shape), tuple(value.stride()))


def _list_bound(node: NodeSpec, args: tuple, kwargs: dict) -> int:
    """An upper bound on how many tensors a list-returning op makes from these arguments,
    known before the op runs (a split into size-1 pieces of a huge dim must never start)."""
    packet = node.target._schema.name.partition("::")[2]
    values = list(args) + list(kwargs.values())
    self_ = args[0] if args and isinstance(args[0], torch.Tensor) else None
    ints = [v for v in values if type(v) is int]
    lists = [v for v in values if isinstance(v, (list, tuple))]
    dim = args[2] if len(args) > 2 and type(args[2]) is int else kwargs.get("dim", 0)
    if self_ is not None and self_.dim() and type(dim) is int and -self_.dim() <= dim < self_.dim():
        dim_size = self_.shape[dim]
    else:
        dim_size = max((s for v in values if isinstance(v, torch.Tensor) for s in v.shape), default=1)
    if node.op in _SPLIT_OPS and len(args) > 1 and type(args[1]) is int and args[1] > 0:
        return math.ceil(dim_size / args[1])
    if packet in ("unbind", "unbind_copy"):
        dim = args[1] if len(args) > 1 and type(args[1]) is int else kwargs.get("dim", 0)
        shape = self_.shape if self_ is not None else ()
        return shape[dim] if type(dim) is int and -len(shape) <= dim < len(shape) else dim_size
    if lists:  # split_with_sizes, tensor_split(indices), foreach ops, meshgrid, ...
        return max(len(v) for v in lists) + 1
    return max([dim_size, *ints, 1])


@functools.cache
def _returns_list(target: Any) -> bool:
    return any(r.type.kind() == "ListType" for r in target._schema.returns)


def _run_on_meta(node: NodeSpec, args: tuple, kwargs: dict, where: str, limits: WireLimits) -> Any:
    """One node's result on meta tensors, checked before and after; WireError on failure."""
    if node.op == GETITEM:
        if not isinstance(args[0], (list, tuple)):
            raise WireError("operator.getitem applies only to ops with several results", where)
        if not -len(args[0]) <= args[1] < len(args[0]):
            raise WireError(f"operator.getitem index {args[1]} out of range for {len(args[0])} results", where)
        return args[0][args[1]]
    if _returns_list(node.target):
        bound = _list_bound(node, args, kwargs)
        if bound > limits.max_nodes:
            raise WireError(f"{node.op} could return {bound} tensors > limit {limits.max_nodes}", where)
    if "device" in arg_names(node.target):
        kwargs = {**kwargs, "device": _META}  # factory ops would allocate on the CPU otherwise
    key = _memo_key(node.target, args, kwargs)
    known = _MEMO.get(key)
    if known is not None:
        return _as_meta(known)
    try:
        result = device_layout.run(node.target, *args, **kwargs)
    except Exception as e:  # any failure of an op on these arguments is the graph's fault
        text = str(e).strip()
        message = text.splitlines()[0][:300] if text else ""
        raise WireError(f"{node.op} fails on its arguments: {type(e).__name__}: {message}", where) from None
    layouts = _layouts(result) if key is not None else None
    if layouts is not None:
        _MEMO.put(key, layouts)
    return result


# What ops gave, for validating a model's repeated layers once (compiler/wire/memo.py).
# Only ops whose results are fresh tensors: a view or an in-place op is run every time,
# so that every alias in a graph is the one its ops make.
_MEMO = Memo(max_entries=4096)  # about 1.5 KB an entry, 11 at most (MAX_LIST): < 50 MB
_Layout = tuple  # (dtype, shape, stride, storage offset)


@functools.cache
def _fresh_results(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return (schema is not None and not schema.is_mutable
            and all(r.alias_info is None for r in schema.returns))


def _memo_key(target: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The op, its tensors' layouts and its other arguments; None when not remembered."""
    if not _fresh_results(target):
        return None
    try:
        return target, plain_value((args, tuple(kwargs.items())), _tensor_layout)
    except TypeError:  # an argument without a faithful key: run it
        return None


def _tensor_layout(value: Any) -> _Layout:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"no key for {type(value).__name__}")
    return _layout(value)


def _layout(t: torch.Tensor) -> _Layout:
    return (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _layouts(result: Any) -> Any:
    """A result as layouts (tensors), ints and Nones (results an op leaves out), in its
    structure; None when it holds anything else (it is not remembered)."""
    if isinstance(result, torch.Tensor):
        return ("t", _layout(result))
    if type(result) is int or result is None:
        return ("i", result)
    if isinstance(result, (list, tuple)) and 0 < len(result) <= MAX_LIST:
        parts = [_layouts(r) for r in result]
        return None if any(p is None for p in parts) else (type(result).__name__, tuple(parts))
    return None


def _as_meta(layouts: Any) -> Any:
    kind, value = layouts
    if kind == "t":
        dtype, shape, stride, offset = value
        base = torch.empty(storage_extent(shape, stride, offset), dtype=dtype, device=_META)
        return base.as_strided(shape, stride, offset)
    if kind == "i":
        return value
    parts = [_as_meta(v) for v in value]
    return parts if kind == "list" else tuple(parts)


def infer_meta(spec: GraphSpec, display: Mapping[str, str], limits: WireLimits,
               deadline: float | None = None,
               cancel: threading.Event | None = None,
               values: dict[str, Any] | None = None) -> dict[str, NodeMeta]:
    """Each node's result meta, computed on meta tensors; WireError naming the node if an op
    rejects its arguments, a result passes the limits, or the elements of all results
    together pass `max_total_numel`. `display` maps names to the names errors should use.
    `values`, when given, receives every input's, constant's and node's meta value (what
    lowering's own metadata run would compute: it takes them instead, `Graph.to_fx`).

    Between nodes: past `deadline` (a `time.monotonic()` value) WireError; with `cancel`
    set, `ValidationCancelled` (no single node runs for long, so either stops soon)."""
    env: dict[str, Any] = {}
    for inp in spec.inputs:
        extent = storage_extent(inp.shape, inp.stride, inp.storage_offset)
        base = torch.empty(extent, dtype=inp.dtype, device=_META)
        env[inp.name] = base.as_strided(inp.shape, inp.stride, inp.storage_offset)
    for const in spec.constants:
        env[const.name] = torch.empty(const.shape, dtype=const.dtype, device=_META)

    def resolve(value: Any) -> Any:
        if isinstance(value, Ref):
            return env[value.name]
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, torch.device):
            return _META
        return value

    metas: dict[str, NodeMeta] = {}
    total = 0
    for node in spec.nodes:
        where = display.get(node.name, node.name)
        if cancel is not None and cancel.is_set():
            raise ValidationCancelled(f"validation stopped at node {where!r}")
        if deadline is not None and time.monotonic() > deadline:
            raise WireError(f"validation took longer than {limits.max_validation_ms} ms "
                            "(KILN_MAX_VALIDATION_MS); send a smaller graph", where)
        args = tuple(resolve(a) for a in node.args)
        kwargs = {k: resolve(v) for k, v in node.kwargs.items()}
        result = _run_on_meta(node, args, kwargs, where, limits)
        metas[node.name] = meta = _result_meta(result, where, limits)
        total += sum(math.prod(m.shape) for m in (meta if isinstance(meta, tuple) else (meta,))
                     if isinstance(m, TensorMeta))
        if total > limits.max_total_numel:
            raise WireError(f"the graph's results hold more than {limits.max_total_numel} "
                            "elements together (KILN_MAX_TOTAL_NUMEL)", where)
        env[node.name] = result
    if values is not None:
        values.update(env)
    return metas
