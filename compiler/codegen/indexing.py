"""Index ops as loads at computed positions: gathers, concatenation, padding, scatters.

`INDEX_OPS` maps an aten op to its rule: (writer, node, index, mask) -> the Triton
expression of the node's value at that index, read from its inputs at other indices.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx

from compiler.codegen.common import (
    Index,
    Unsupported,
    Var,
    broadcast_index,
    cast,
    compute_dtype,
    literal,
    norm_dim,
    paren,
)
from compiler.codegen.writer import Writer
from compiler.ir import base_name, meta

IndexRule = Callable[[Writer, fx.Node, Index, str], str]


def _and(w: Writer, mask: str, cond: str) -> str:
    return w.tmp(f"{mask} & ({cond})", prefix="mask")


def _gather(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    out = meta(node)
    cd = compute_dtype(out.dtype)
    src, dim, index = node.args[0], norm_dim(node.args[1], len(out.shape)), node.args[2]
    i = w.value(index, broadcast_index(idx, out.shape, meta(index).shape), mask)
    return cast(Var(w.value(src, idx[:dim] + (i,) + idx[dim + 1:], mask), cd), cd)


def _index_select(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    src, dim, index = node.args[0], norm_dim(node.args[1], len(meta(node).shape)), node.args[2]
    i = w.value(index, (idx[dim],) if meta(index).shape else (), mask)
    return w.value(src, idx[:dim] + (i,) + idx[dim + 1:], mask)


def _embedding(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    weight, indices = node.args[0], node.args[1]
    i = w.value(indices, idx[:-1], mask)
    return w.value(weight, (i, idx[-1]), mask)


def _index(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    src, indices = node.args[0], node.args[1]
    if any(t is None for t in indices):
        raise Unsupported("index with None entries")
    metas = [meta(t) for t in indices]
    if any(m.dtype in (torch.bool, torch.uint8) for m in metas):
        raise Unsupported("index with boolean masks")
    bshape = torch.broadcast_shapes(*[m.shape for m in metas])
    lead = idx[: len(bshape)]
    positions = []
    for t, m, d in zip(indices, metas, range(len(indices)), strict=False):
        i = w.value(t, broadcast_index(lead, tuple(bshape), m.shape), mask)
        size = meta(src).shape[d]
        positions.append(w.tmp(f"tl.where({i} < 0, {i} + {size}, {i})"))
    return w.value(src, tuple(positions) + idx[len(bshape):], mask)


def _cat(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    out = meta(node)
    cd = compute_dtype(out.dtype)
    args = node.args
    tensors = [t for t in args[0] if meta(t).numel > 0 or len(meta(t).shape) == len(out.shape)]
    dim = norm_dim(args[1] if len(args) > 1 else 0, len(out.shape))
    pieces, start = [], 0
    for t in tensors:
        size = meta(t).shape[dim]
        if size == 0:
            continue
        end = start + size
        cond = f"({idx[dim]} >= {start}) & ({idx[dim]} < {end})"
        sub = idx[:dim] + (f"{paren(idx[dim])} - {start}" if start else idx[dim],) + idx[dim + 1:]
        v = w.value(t, sub, _and(w, mask, cond))
        pieces.append((cond, cast(Var(v, compute_dtype(meta(t).dtype)), cd)))
        start = end
    expr = pieces[-1][1]
    for cond, v in reversed(pieces[:-1]):
        expr = w.tmp(f"tl.where({cond}, {v}, {expr})")
    return expr


def _constant_pad_nd(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    out = meta(node)
    cd = compute_dtype(out.dtype)
    src, pad = node.args[0], node.args[1]
    value = node.args[2] if len(node.args) > 2 else 0
    inp = meta(src)
    sub, conds = list(idx), []
    for k in range(len(pad) // 2):
        d = len(out.shape) - 1 - k
        left = pad[2 * k]
        sub[d] = f"{paren(idx[d])} - {left}" if left else idx[d]
        conds.append(f"({sub[d]} >= 0) & ({sub[d]} < {inp.shape[d]})")
    cond = " & ".join(conds) or "1"
    v = w.value(src, tuple(sub), _and(w, mask, cond))
    return f"tl.where({cond}, {cast(Var(v, compute_dtype(inp.dtype)), cd)}, {literal(value or 0, cd)})"


def _flip(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    out = meta(node)
    cd = compute_dtype(out.dtype)
    dims = {norm_dim(d, len(out.shape)) for d in node.args[1]}
    sub = tuple(f"{out.shape[d] - 1} - {paren(e)}" if d in dims and out.shape[d] > 1 else e
                for d, e in enumerate(idx))
    return cast(Var(w.value(node.args[0], sub, mask), cd), cd)


def _scatter_position(node: fx.Node, idx: Index) -> tuple[str, Index]:
    """(condition, index into src) of a slice_scatter/select_scatter element at `idx`."""
    args, out = node.args, meta(node)
    dim = norm_dim(args[2] if len(args) > 2 else 0, len(out.shape))
    size = out.shape[dim]
    if base_name(node) == "select_scatter":
        index = args[3] + size if args[3] < 0 else args[3]
        return f"{idx[dim]} == {index}", idx[:dim] + idx[dim + 1:]
    start = args[3] if len(args) > 3 and args[3] is not None else 0
    end = args[4] if len(args) > 4 and args[4] is not None else size
    step = args[5] if len(args) > 5 else 1
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(start, min(size, end + size if end < 0 else end))
    rel = f"{paren(idx[dim])} - {start}" if start else idx[dim]
    cond = f"({idx[dim]} >= {start}) & ({idx[dim]} < {end})"
    if step != 1:
        cond += f" & ({paren(rel)} % {step} == 0)"
        rel = f"{paren(rel)} // {step}"
    return cond, idx[:dim] + (rel,) + idx[dim + 1:]


def _scatter(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    cd = compute_dtype(meta(node).dtype)
    base, src = node.args[0], node.args[1]
    cond, sub = _scatter_position(node, idx)
    v_src = w.value(src, sub, _and(w, mask, cond))
    v_base = w.value(base, idx, mask)
    return (f"tl.where({cond}, {cast(Var(v_src, compute_dtype(meta(src).dtype)), cd)}, "
            f"{cast(Var(v_base, compute_dtype(meta(base).dtype)), cd)})")


INDEX_OPS: dict[str, IndexRule] = {
    "gather": _gather, "index_select": _index_select, "embedding": _embedding, "index": _index,
    "cat": _cat, "constant_pad_nd": _constant_pad_nd, "flip": _flip,
    "slice_scatter": _scatter, "select_scatter": _scatter,
}
