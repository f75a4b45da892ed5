"""Views and index ops as index arithmetic: what element of its input each output reads."""

from __future__ import annotations

import torch
from torch import fx

from compiler.codegen.common import (
    Index,
    Unsupported,
    Var,
    Writer,
    broadcast_index,
    cast,
    compute_dtype,
    literal,
    paren,
    reshape_index,
)
from compiler.ir import meta
from compiler.ops import VIEWS, base_name


def linear_expr(pos: str, step: object, start: object) -> str:
    """`start + pos * step`, without the zero and unit terms."""
    term = pos if step == 1 else f"{paren(pos)} * {step}"
    return term if start == 0 else f"{start} + {term}"


# ---- views -----------------------------------------------------------------------------------


_SPLITS = frozenset({"split", "split_with_sizes", "unbind"})


def is_view(node: fx.Node) -> bool:
    """True when `node` is a view op that code generation treats as index arithmetic
    (including `getitem` of a split or unbind)."""
    if node.op != "call_function" or base_name(node) not in VIEWS:
        return False
    if base_name(node) == "getitem":
        src = node.args[0]
        return isinstance(src, fx.Node) and src.op == "call_function" and base_name(src) in _SPLITS
    return True


def _split_piece(split: fx.Node, i: int) -> tuple[int, int, int]:
    """(dim, start, size) of piece i of a split/unbind node."""
    inp = meta(split.args[0])
    name = base_name(split)
    rank = len(inp.shape)
    if name == "unbind":
        dim = _norm(split.args[1] if len(split.args) > 1 else 0, rank)
        return dim, i, 0
    dim = _norm(split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0), rank)
    if name == "split_with_sizes":
        sizes = list(split.args[1])
    else:
        step = split.args[1]
        sizes = [min(step, inp.shape[dim] - s) for s in range(0, inp.shape[dim], step)]
    return dim, sum(sizes[:i]), sizes[i]


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def view_source(node: fx.Node, idx: Index) -> tuple[fx.Node, Index]:
    """(input node, index into it) for the element at `idx` of view `node`."""
    name = base_name(node)
    src = node.args[0]
    if name == "getitem":
        dim, start, _ = _split_piece(src, node.args[1])
        base = src.args[0]
        if base_name(src) == "unbind":
            return base, idx[:dim] + (str(start),) + idx[dim:]
        pos = idx[dim] if not start else (str(start) if idx[dim] == "0" else f"{paren(idx[dim])} + {start}")
        return base, idx[:dim] + (pos,) + idx[dim + 1:]
    out, inp = meta(node), meta(src)
    if name in ("view", "reshape", "_unsafe_view", "view_as"):
        return src, reshape_index(idx, out.shape, inp.shape)
    if name in ("expand", "expand_as"):
        return src, broadcast_index(idx, out.shape, inp.shape)
    if name == "alias":
        return src, idx
    if name in ("permute",):
        dims = [_norm(d, len(inp.shape)) for d in node.args[1]]
        result = ["0"] * len(inp.shape)
        for k, d in enumerate(dims):
            result[d] = idx[k]
        return src, tuple(result)
    if name in ("t", "numpy_T"):
        return src, tuple(reversed(idx))
    if name == "transpose":
        d0, d1 = (_norm(d, len(inp.shape)) for d in node.args[1:3])
        result = list(idx)
        result[d0], result[d1] = idx[d1], idx[d0]
        return src, tuple(result)
    if name == "unsqueeze":
        d = _norm(node.args[1], len(out.shape))
        return src, idx[:d] + idx[d + 1:]
    if name == "squeeze":
        if len(node.args) == 1:
            removed = set(range(len(inp.shape)))
        else:
            dims = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
            removed = {_norm(d, max(len(inp.shape), 1)) for d in dims}
        result, it = [], iter(idx)
        for d, size in enumerate(inp.shape):
            result.append("0" if size == 1 and d in removed else next(it))
        return src, tuple(result)
    if name == "slice":
        dim = _norm(node.args[1] if len(node.args) > 1 else 0, len(inp.shape))
        start = node.args[2] if len(node.args) > 2 else 0
        step = node.args[4] if len(node.args) > 4 else 1
        start = 0 if start is None else start
        size = inp.shape[dim]
        start = max(0, min(size, start + size if start < 0 else start))
        result = list(idx)
        result[dim] = linear_expr(idx[dim], step, start) if idx[dim] != "0" else str(start)
        return src, tuple(result)
    if name == "select":
        dim = _norm(node.args[1], len(inp.shape))
        index = node.args[2]
        index = index + inp.shape[dim] if index < 0 else index
        return src, idx[:dim] + (str(index),) + idx[dim:]
    raise Unsupported(f"view {name}")


# ---- index ops -------------------------------------------------------------------------------


def _and(w: Writer, mask: str, cond: str) -> str:
    return w.tmp(f"{mask} & ({cond})", prefix="mask")


def index_op(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    """Value of index op `node` (gather, cat, pad, ...) at `idx`."""
    name = base_name(node)
    out = meta(node)
    cd = compute_dtype(out.dtype)
    args = node.args
    if name == "gather":
        src, dim, index = args[0], _norm(args[1], len(out.shape)), args[2]
        i = w.value(index, broadcast_index(idx, out.shape, meta(index).shape), mask)
        return cast(Var(w.value(src, idx[:dim] + (i,) + idx[dim + 1:], mask), cd), cd)
    if name == "index_select":
        src, dim, index = args[0], _norm(args[1], len(out.shape)), args[2]
        i = w.value(index, (idx[dim],) if meta(index).shape else (), mask)
        return w.value(src, idx[:dim] + (i,) + idx[dim + 1:], mask)
    if name == "embedding":
        weight, indices = args[0], args[1]
        i = w.value(indices, idx[:-1], mask)
        return w.value(weight, (i, idx[-1]), mask)
    if name == "index":
        src, indices = args[0], args[1]
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
    if name == "cat":
        tensors = [t for t in args[0] if meta(t).numel > 0 or len(meta(t).shape) == len(out.shape)]
        dim = _norm(args[1] if len(args) > 1 else 0, len(out.shape))
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
    if name == "constant_pad_nd":
        src, pad = args[0], args[1]
        value = args[2] if len(args) > 2 else 0
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
    if name == "flip":
        dims = {_norm(d, len(out.shape)) for d in args[1]}
        sub = tuple(f"{out.shape[d] - 1} - {paren(e)}" if d in dims and out.shape[d] > 1 else e
                    for d, e in enumerate(idx))
        return cast(Var(w.value(args[0], sub, mask), cd), cd)
    if name in ("slice_scatter", "select_scatter"):
        base, src = args[0], args[1]
        dim = _norm(args[2] if len(args) > 2 else 0, len(out.shape))
        size = out.shape[dim]
        if name == "select_scatter":
            index = args[3] + size if args[3] < 0 else args[3]
            cond = f"{idx[dim]} == {index}"
            sub = idx[:dim] + idx[dim + 1:]
        else:
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
            sub = idx[:dim] + (rel,) + idx[dim + 1:]
        v_src = w.value(src, sub, _and(w, mask, cond))
        v_base = w.value(base, idx, mask)
        return (f"tl.where({cond}, {cast(Var(v_src, compute_dtype(meta(src).dtype)), cd)}, "
                f"{cast(Var(v_base, compute_dtype(meta(base).dtype)), cd)})")
    raise Unsupported(f"index op {name}")


INDEX_OPS = frozenset({"gather", "index_select", "embedding", "index", "cat", "constant_pad_nd",
                        "slice_scatter", "select_scatter", "flip"})
