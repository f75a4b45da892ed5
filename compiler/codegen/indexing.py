"""Index ops as loads at computed positions: gathers, concatenation, padding, scatters.

`INDEX_OPS` maps an aten op to its rule: (writer, node, index, mask) -> the Triton
expression of the node's value at that index, read from its inputs at other indices.
`INDEX_READS` declares, with the same position arithmetic and no code, where each rule
reads each input for the value at an index: a position loaded from another tensor (a
gather's) is `common.gathered`, a symbol no kernel index equals.
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
    gathered,
    literal,
    norm_dim,
    paren,
)
from compiler.codegen.writer import Writer
from compiler.ir import base_name, meta

IndexRule = Callable[[Writer, fx.Node, Index, str], str]
IndexReads = Callable[[fx.Node, Index], list[tuple[fx.Node, Index]]]


def _and(w: Writer, mask: str, cond: str) -> str:
    return w.tmp(f"{mask} & ({cond})", prefix="mask")


def _at(idx: Index, dim: int, pos: str) -> Index:
    """`idx` with its `dim` replaced by `pos`."""
    return idx[:dim] + (pos,) + idx[dim + 1:]


def _gather_args(node: fx.Node) -> tuple[fx.Node, int, fx.Node]:
    return node.args[0], norm_dim(node.args[1], len(meta(node).shape)), node.args[2]


def _gather(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    out = meta(node)
    cd = compute_dtype(out.dtype)
    src, dim, index = _gather_args(node)
    i = w.value(index, broadcast_index(idx, out.shape, meta(index).shape), mask)
    return cast(Var(w.value(src, _at(idx, dim, i), mask), cd), cd)


def _gather_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    src, dim, index = _gather_args(node)
    return [(index, broadcast_index(idx, meta(node).shape, meta(index).shape)),
            (src, _at(idx, dim, gathered(index.name)))]


def _index_select_position(node: fx.Node, idx: Index) -> tuple[fx.Node, int, fx.Node, Index]:
    """(src, dim, index tensor, where the index tensor is read)."""
    src, dim, index = node.args[0], norm_dim(node.args[1], len(meta(node).shape)), node.args[2]
    return src, dim, index, (idx[dim],) if meta(index).shape else ()


def _index_select(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    src, dim, index, at = _index_select_position(node, idx)
    return w.value(src, _at(idx, dim, w.value(index, at, mask)), mask)


def _index_select_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    src, dim, index, at = _index_select_position(node, idx)
    return [(index, at), (src, _at(idx, dim, gathered(index.name)))]


def _embedding(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    weight, indices = node.args[0], node.args[1]
    i = w.value(indices, idx[:-1], mask)
    return w.value(weight, (i, idx[-1]), mask)


def _embedding_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    weight, indices = node.args[0], node.args[1]
    return [(indices, idx[:-1]), (weight, (gathered(indices.name), idx[-1]))]


def index_refusal(node: fx.Node) -> str | None:
    """Why an index op cannot be computed in a kernel, or None (`index` with None entries
    or boolean masks; the other index ops take every form)."""
    if base_name(node) != "index":
        return None
    if any(t is None for t in node.args[1]):
        return "index with None entries"
    if any(meta(t).dtype in (torch.bool, torch.uint8) for t in node.args[1]):
        return "index with boolean masks"
    return None


def _index_positions(node: fx.Node, idx: Index) -> tuple[list[tuple[fx.Node, Index]], Index]:
    """Where `index` reads each index tensor, and the dims of its result past them."""
    indices = node.args[1]
    metas = [meta(t) for t in indices]
    bshape = tuple(torch.broadcast_shapes(*[m.shape for m in metas]))
    lead = idx[: len(bshape)]
    return [(t, broadcast_index(lead, bshape, m.shape)) for t, m in zip(indices, metas, strict=True)], \
        idx[len(bshape):]


def _index(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    reason = index_refusal(node)
    if reason is not None:
        raise Unsupported(reason)
    src = node.args[0]
    reads, rest = _index_positions(node, idx)
    positions = []
    for d, (t, at) in enumerate(reads):
        i = w.value(t, at, mask)
        size = meta(src).shape[d]
        positions.append(w.tmp(f"tl.where({i} < 0, {i} + {size}, {i})"))
    return w.value(src, tuple(positions) + rest, mask)


def _index_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    reads, rest = _index_positions(node, idx)
    return [*reads, (node.args[0], tuple(gathered(t.name) for t, _ in reads) + rest)]


def _cat_pieces(node: fx.Node, idx: Index) -> list[tuple[fx.Node, str, Index]]:
    """(input, condition, index into it) of each non-empty piece of a `cat`."""
    out = meta(node)
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
        pieces.append((t, cond, _at(idx, dim, f"{paren(idx[dim])} - {start}" if start else idx[dim])))
        start = end
    return pieces


def _cat(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    cd = compute_dtype(meta(node).dtype)
    pieces = []
    for t, cond, sub in _cat_pieces(node, idx):
        v = w.value(t, sub, _and(w, mask, cond))
        pieces.append((cond, cast(Var(v, compute_dtype(meta(t).dtype)), cd)))
    expr = pieces[-1][1]
    for cond, v in reversed(pieces[:-1]):
        expr = w.tmp(f"tl.where({cond}, {v}, {expr})")
    return expr


def _pad_position(node: fx.Node, idx: Index) -> tuple[Index, str]:
    """(index into the input, condition that it is inside) of a `constant_pad_nd` element."""
    out, pad, inp = meta(node), node.args[1], meta(node.args[0])
    sub, conds = list(idx), []
    for k in range(len(pad) // 2):
        d = len(out.shape) - 1 - k
        left = pad[2 * k]
        sub[d] = f"{paren(idx[d])} - {left}" if left else idx[d]
        conds.append(f"({sub[d]} >= 0) & ({sub[d]} < {inp.shape[d]})")
    return tuple(sub), " & ".join(conds) or "1"


def _constant_pad_nd(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    cd = compute_dtype(meta(node).dtype)
    src = node.args[0]
    value = node.args[2] if len(node.args) > 2 else 0
    sub, cond = _pad_position(node, idx)
    v = w.value(src, sub, _and(w, mask, cond))
    return f"tl.where({cond}, {cast(Var(v, compute_dtype(meta(src).dtype)), cd)}, {literal(value or 0, cd)})"


def _flip_index(node: fx.Node, idx: Index) -> Index:
    out = meta(node)
    dims = {norm_dim(d, len(out.shape)) for d in node.args[1]}
    return tuple(f"{out.shape[d] - 1} - {paren(e)}" if d in dims and out.shape[d] > 1 else e
                 for d, e in enumerate(idx))


def _flip(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    cd = compute_dtype(meta(node).dtype)
    return cast(Var(w.value(node.args[0], _flip_index(node, idx), mask), cd), cd)


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


def _scatter_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    return [(node.args[1], _scatter_position(node, idx)[1]), (node.args[0], idx)]


INDEX_OPS: dict[str, IndexRule] = {
    "gather": _gather, "index_select": _index_select, "embedding": _embedding, "index": _index,
    "cat": _cat, "constant_pad_nd": _constant_pad_nd, "flip": _flip,
    "slice_scatter": _scatter, "select_scatter": _scatter,
}

INDEX_READS: dict[str, IndexReads] = {
    "gather": _gather_reads, "index_select": _index_select_reads,
    "embedding": _embedding_reads, "index": _index_reads,
    "cat": lambda node, idx: [(t, sub) for t, _, sub in _cat_pieces(node, idx)],
    "constant_pad_nd": lambda node, idx: [(node.args[0], _pad_position(node, idx)[0])],
    "flip": lambda node, idx: [(node.args[0], _flip_index(node, idx))],
    "slice_scatter": _scatter_reads, "select_scatter": _scatter_reads,
}
