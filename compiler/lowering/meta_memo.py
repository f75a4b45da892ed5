"""What an op gives on the meta device, remembered by op, argument metadata and other
arguments, for the whole process.

Lowering runs each graph on the meta device after every pass that changes it, and a
model's layers repeat the same ops on the same shapes: a training step's forward and
backward, the same layer at each depth, the decompositions spliced into each of them.
An op's result metadata follows only from its op, its tensor arguments' metadata and its
other arguments, so it is computed once per such key (`remembered`, `remember`) and
every later node takes it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from torch import fx

from compiler.ir import TensorMeta

MAX_ENTRIES = 50_000  # about 30 graphs of a thousand distinct nodes; a few MB

_LOCK = threading.Lock()
_MEMO: OrderedDict[tuple, object] = OrderedDict()

_ATOMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unkeyable(Exception):
    """An argument the key cannot hold faithfully: the node is run, not remembered."""


def plain_value(value: object) -> object:
    """A hashable stand-in for an argument that is not a node, faithful to everything an
    op may read from it: its type (1, 1.0 and True differ) and a float's sign and bits
    (-0.0 and 0.0 differ). Raises TypeError for anything else (a tensor, an object)."""
    if isinstance(value, float):
        return ("float", value.hex())
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    if isinstance(value, _ATOMS):
        return value
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(plain_value(v) for v in value))
    if isinstance(value, slice):
        return ("slice", plain_value(value.start), plain_value(value.stop), plain_value(value.step))
    raise TypeError(f"no key for {type(value).__name__}")


def _frozen(value: object) -> object:
    if isinstance(value, fx.Node):
        return _node_meta(value.meta.get("kiln_meta"))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _frozen(v)) for k, v in value.items()))
    try:
        return plain_value(value)
    except TypeError:
        raise _Unkeyable from None


def _node_meta(meta: object) -> object:
    """A node argument's recorded metadata: tensors only (a node holding an int has none)."""
    if isinstance(meta, TensorMeta):
        return meta
    if isinstance(meta, (list, tuple)) and meta:
        return (type(meta).__name__, tuple(_node_meta(m) for m in meta))
    raise _Unkeyable


def key_of(node: fx.Node) -> tuple | None:
    """What `node`'s result metadata follows from, given its arguments' recorded metadata
    (`kiln_meta`); None when an argument has none or cannot be keyed."""
    try:
        return node.target, _frozen(node.args), _frozen(node.kwargs)
    except _Unkeyable:
        return None


def remembered(key: tuple | None) -> object | None:
    """The result metadata (TensorMetas in the result's structure) remembered for `key`."""
    if key is None:
        return None
    with _LOCK:
        found = _MEMO.get(key)
        if found is not None:
            _MEMO.move_to_end(key)
        return found


def remember(key: tuple | None, result: object) -> None:
    """Keep `result` (TensorMetas in the op's result structure) for `key`; only results
    made of tensors are kept (what a meta tensor can be made again from)."""
    if key is None or not _all_tensors(result):
        return
    with _LOCK:
        _MEMO[key] = result
        while len(_MEMO) > MAX_ENTRIES:
            _MEMO.popitem(last=False)


def _all_tensors(result: object) -> bool:
    if isinstance(result, TensorMeta):
        return True
    return isinstance(result, (list, tuple)) and bool(result) and all(_all_tensors(r) for r in result)


def forget() -> None:
    """Drop everything remembered (tests; a process that changes torch's meta kernels)."""
    with _LOCK:
        _MEMO.clear()
