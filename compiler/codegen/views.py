"""Views as index arithmetic: which element of its input each element of a view reads.

`VIEWS` maps an aten view op to its rule: (node, index into the view) -> (input node,
index into the input). No copy is ever made; loads follow views to their buffer.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import fx

from compiler.codegen.common import (
    Index,
    Unsupported,
    broadcast_index,
    linear_expr,
    norm_dim,
    paren,
    reshape_index,
)
from compiler.ir import base_name, meta

ViewRule = Callable[[fx.Node, Index], tuple[fx.Node, Index]]


def _split_piece(split: fx.Node, i: int) -> tuple[int, int, int]:
    """(dim, start, size) of piece i of a split/unbind node."""
    inp = meta(split.args[0])
    name = base_name(split)
    rank = len(inp.shape)
    if name == "unbind":
        dim = norm_dim(split.args[1] if len(split.args) > 1 else 0, rank)
        return dim, i, 0
    dim = norm_dim(split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0), rank)
    if name == "split_with_sizes":
        sizes = list(split.args[1])
    else:
        step = split.args[1]
        sizes = [min(step, inp.shape[dim] - s) for s in range(0, inp.shape[dim], step)]
    return dim, sum(sizes[:i]), sizes[i]


def _getitem(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    dim, start, _ = _split_piece(src, node.args[1])
    base = src.args[0]
    if base_name(src) == "unbind":
        return base, idx[:dim] + (str(start),) + idx[dim:]
    pos = idx[dim] if not start else (str(start) if idx[dim] == "0" else f"{paren(idx[dim])} + {start}")
    return base, idx[:dim] + (pos,) + idx[dim + 1:]


def _tuple_view(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    # split/unbind make a tuple: kernels read its pieces through their getitems
    raise Unsupported(f"view {base_name(node)}")


def _reshape(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    return src, reshape_index(idx, meta(node).shape, meta(src).shape)


def _expand(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    return src, broadcast_index(idx, meta(node).shape, meta(src).shape)


def _alias(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    return node.args[0], idx


def _permute(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    rank = len(meta(src).shape)
    result = ["0"] * rank
    for k, d in enumerate(node.args[1]):
        result[norm_dim(d, rank)] = idx[k]
    return src, tuple(result)


def _reverse(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    return node.args[0], tuple(reversed(idx))


def _transpose(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    d0, d1 = (norm_dim(d, len(meta(src).shape)) for d in node.args[1:3])
    result = list(idx)
    result[d0], result[d1] = idx[d1], idx[d0]
    return src, tuple(result)


def _unsqueeze(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    d = norm_dim(node.args[1], len(meta(node).shape))
    return node.args[0], idx[:d] + idx[d + 1:]


def _squeeze(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    inp = meta(src)
    if len(node.args) == 1:
        removed = set(range(len(inp.shape)))
    else:
        dims = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
        removed = {norm_dim(d, max(len(inp.shape), 1)) for d in dims}
    result, it = [], iter(idx)
    for d, size in enumerate(inp.shape):
        result.append("0" if size == 1 and d in removed else next(it))
    return src, tuple(result)


def _slice(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    inp = meta(src)
    dim = norm_dim(node.args[1] if len(node.args) > 1 else 0, len(inp.shape))
    start = node.args[2] if len(node.args) > 2 else 0
    step = node.args[4] if len(node.args) > 4 else 1
    start = 0 if start is None else start
    size = inp.shape[dim]
    start = max(0, min(size, start + size if start < 0 else start))
    result = list(idx)
    result[dim] = linear_expr(idx[dim], step, start) if idx[dim] != "0" else str(start)
    return src, tuple(result)


def _select(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    src = node.args[0]
    inp = meta(src)
    dim = norm_dim(node.args[1], len(inp.shape))
    index = node.args[2]
    index = index + inp.shape[dim] if index < 0 else index
    return src, idx[:dim] + (str(index),) + idx[dim:]


VIEWS: dict[str, ViewRule] = {
    "view": _reshape, "reshape": _reshape, "_unsafe_view": _reshape, "view_as": _reshape,
    "expand": _expand, "expand_as": _expand, "alias": _alias, "permute": _permute,
    "t": _reverse, "numpy_T": _reverse, "transpose": _transpose, "unsqueeze": _unsqueeze,
    "squeeze": _squeeze, "slice": _slice, "select": _select,
    "split": _tuple_view, "split_with_sizes": _tuple_view, "unbind": _tuple_view,
    "getitem": _getitem,
}
SPLITS = frozenset({"split", "split_with_sizes", "unbind"})  # tuples of views (their getitems)


def is_view(node: fx.Node) -> bool:
    """True when `node` is a view op that code generation treats as index arithmetic
    (including `getitem` of a split or unbind)."""
    if node.op != "call_function" or base_name(node) not in VIEWS:
        return False
    if base_name(node) == "getitem":
        src = node.args[0]
        return isinstance(src, fx.Node) and src.op == "call_function" and base_name(src) in SPLITS
    return True


def view_source(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    """(input node, index into it) for the element at `idx` of view `node`."""
    return VIEWS[base_name(node)](node, idx)
