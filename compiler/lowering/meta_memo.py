"""Lowering's memo of what an op gives on the meta device, by op, argument metadata
(`kiln_meta`) and other arguments, for the whole process (`compiler/wire/memo.py`).

Lowering runs each graph on the meta device after every pass that changes it; a training
step's forward and backward, the same layer at each depth and the decompositions spliced
into each of them repeat the same ops on the same metadata. An op's result metadata
follows only from those, so it is computed once per key (`remembered`, `remember`).
"""

from __future__ import annotations

from torch import fx

from compiler.ir import TensorMeta
from compiler.wire.memo import MAX_LIST, Memo, plain_value

_MEMO = Memo(max_entries=16_384)  # about 1 KB an entry; a graph has a few hundred


def _node_meta(value: object) -> object:
    """A node argument's recorded metadata (`kiln_meta`)."""
    if not isinstance(value, fx.Node):
        raise TypeError(f"no key for {type(value).__name__}")
    return _tensor_metas(value.meta.get("kiln_meta"))


def _tensor_metas(meta: object) -> object:
    """Recorded metadata of tensors only (a node holding an int has none)."""
    if isinstance(meta, TensorMeta):
        return meta
    if isinstance(meta, (list, tuple)) and 0 < len(meta) <= MAX_LIST:
        return (type(meta).__name__, tuple(_tensor_metas(m) for m in meta))
    raise TypeError("an argument without tensor metadata")


def key_of(node: fx.Node) -> tuple | None:
    """What `node`'s result metadata follows from, given its arguments' recorded metadata
    (`kiln_meta`); None when an argument has none or cannot be keyed."""
    try:
        return node.target, plain_value((node.args, tuple(node.kwargs.items())), _node_meta)
    except TypeError:
        return None


def remembered(key: tuple | None) -> object | None:
    """The result metadata (TensorMetas in the result's structure) remembered for `key`."""
    return _MEMO.get(key)


def remember(key: tuple | None, result: object) -> None:
    """Keep `result` (TensorMetas in the op's result structure) for `key`; only results
    made of tensors are kept (what a meta tensor can be made again from)."""
    if _all_tensors(result):
        _MEMO.put(key, result)


def _all_tensors(result: object) -> bool:
    if isinstance(result, TensorMeta):
        return True
    return (isinstance(result, (list, tuple)) and 0 < len(result) <= MAX_LIST
            and all(_all_tensors(r) for r in result))


def forget() -> None:
    """Drop everything remembered (tests; a process that changes torch's meta kernels)."""
    _MEMO.clear()
