"""fx GraphModule (aten level) -> raw kiln.graph/1 document, before canonicalisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from compiler.wire.limits import WireLimits
from compiler.wire.schema import FORMAT, WireError, encode_float, encode_value, op_name


def _field(value: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if hasattr(value, name):
            field = getattr(value, name)
            return field() if callable(field) else field
    return default


def _input_entry(node: fx.Node, value: Any) -> dict[str, Any]:
    """A tensor, or a description with dtype, shape, stride and storage_offset (or offset)
    such as `Graph.inputs` entries."""
    if isinstance(value, torch.Tensor):
        dtype, shape, stride = value.dtype, value.shape, value.stride()
        offset, requires_grad = value.storage_offset(), value.requires_grad
    elif isinstance(getattr(value, "dtype", None), torch.dtype) and hasattr(value, "shape") and hasattr(value, "stride"):
        dtype, shape, stride = value.dtype, _field(value, "shape"), _field(value, "stride")
        offset = _field(value, "storage_offset", "offset", default=0)
        requires_grad = bool(_field(value, "requires_grad", default=False))
    else:
        raise WireError(
            f"input is a {type(value).__name__}; only tensors (or tensor descriptions) travel "
            "(trace with static shapes)",
            node.name,
        )
    if any(type(v) is not int for v in (*shape, *stride, offset)):
        raise WireError("input has symbolic or non-integer sizes; trace with static shapes", node.name)
    return {
        "name": node.name,
        "dtype": str(dtype).removeprefix("torch."),
        "shape": list(shape),
        "stride": list(stride),
        "storage_offset": offset,
        "requires_grad": requires_grad,
    }


def _constant_entry(gm: fx.GraphModule, node: fx.Node) -> dict[str, Any]:
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise WireError(f"get_attr of a {type(value).__name__}; only tensor constants travel", node.name)
    data = value.detach().to("cpu").contiguous().flatten().tolist()
    if value.dtype.is_floating_point:
        data = [encode_float(v) for v in data]
    return {
        "name": node.name,
        "dtype": str(value.dtype).removeprefix("torch."),
        "shape": list(value.shape),
        "data": data,
    }


def encode_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], limits: WireLimits) -> dict[str, Any]:
    """The raw wire document of `gm` (fx names, no meta); WireError naming the node when a
    node cannot travel."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise WireError(f"graph has {len(placeholders)} placeholders but {len(example_inputs)} example inputs")
    names = {n: n.name for n in gm.graph.nodes}
    doc: dict[str, Any] = {
        "format": FORMAT,
        "inputs": [_input_entry(n, v) for n, v in zip(placeholders, example_inputs, strict=True)],
        "nodes": [],
        "outputs": [],
        "constants": [],
    }
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            doc["constants"].append(_constant_entry(gm, node))
        elif node.op == "call_function":
            try:
                entry = {
                    "name": node.name,
                    "op": op_name(node.target),
                    "args": [encode_value(a, names, limits.max_str_chars) for a in node.args],
                    "kwargs": {k: encode_value(v, names, limits.max_str_chars) for k, v in node.kwargs.items()},
                }
            except WireError as e:
                raise WireError(e.reason, node.name) from None
            doc["nodes"].append(entry)
        elif node.op == "output":
            leaves, _ = tree_flatten(node.args[0])
            for leaf in leaves:
                if leaf is not None and not isinstance(leaf, fx.Node):
                    raise WireError(f"graph output of type {type(leaf).__name__} is not a node", node.name)
                doc["outputs"].append(None if leaf is None else {"ref": leaf.name})
        elif node.op != "placeholder":
            raise WireError(f"{node.op} nodes are not supported; trace to aten ops (AOTAutograd / make_fx)", node.name)
    return doc
