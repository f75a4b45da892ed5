"""Reduction kernels: XBLOCK rows per program, each reduced over RBLOCK-wide chunks.

The pieces every reduction variant is made of: parsing a reduction node
(`reduction_info`), one reduction's accumulator (`Reducer`) and the kernel's row frame
(`RowFrame`: prologue, row loops, stores). The variants themselves (how they loop over the
rows) are the reduction kind's, listed in `compiler.codegen.kinds.reduction`; the source depends on the variant, never on the
block sizes.

NaN follows torch: a floating max/min is NaN when any reduced element is NaN, and
argmax/argmin give the index of the first NaN. Triton's `tl.max`/`tl.min` skip NaN
(maxnum/minnum), so each such reduction also reduces a NaN flag (or key) in the same
pass over the data: lane accumulators use NaN-propagating `tl.maximum`/`tl.minimum`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from compiler.codegen.common import (
    Index,
    NotFusible,
    Unsupported,
    compute_dtype,
    dim_names,
    literal,
    tl_dtype,
)
from compiler.codegen.writer import Generated, Writer, assemble, define_dims, store
from compiler.ir import Domain, KernelGroup, base_name, meta


@dataclass(frozen=True)
class ReductionInfo:
    """What a reduction node reduces: input, op, dims (sorted, normalized), keepdim."""

    node: fx.Node
    source: fx.Node
    op: str
    dims: tuple[int, ...]
    keepdim: bool

    @property
    def domain(self) -> Domain:
        return Domain(meta(self.source).shape, self.dims)


# aten reduction -> what it reduces with
OPS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max", "min": "min",
        "prod": "prod", "any": "any", "all": "all", "argmax": "argmax", "argmin": "argmin"}


def reduction_info(node: fx.Node) -> ReductionInfo:
    """Parse a reduction node; raises Unsupported for forms kept as ATen calls."""
    name = base_name(node)
    if name not in OPS or not isinstance(node.args[0], fx.Node):
        raise Unsupported(f"reduction {name}")
    if not hasattr(meta(node), "shape"):
        raise Unsupported(f"{name} with several outputs")
    src = node.args[0]
    rank = len(meta(src).shape)
    overload = node.target._overloadname  # type: ignore[union-attr]
    args, kw = list(node.args[1:]), node.kwargs
    if name in ("max", "min") and overload != "default":
        raise Unsupported(f"{name}.{overload} returns values and indices")
    dims: object = None
    keepdim = False
    if name in ("argmax", "argmin"):
        dims = args[0] if args else kw.get("dim")
        keepdim = bool(args[1] if len(args) > 1 else kw.get("keepdim", False))
        if dims is not None:
            dims = [dims]
    elif overload != "default" or name in ("amax", "amin"):
        dims = args[0] if args else kw.get("dim", [])
        keepdim = bool(args[1] if len(args) > 1 else kw.get("keepdim", False))
    if isinstance(dims, int):
        dims = [dims]
    if not dims:  # None or []: every dim
        dims = list(range(rank))
    norm = tuple(sorted({d + rank if d < 0 else d for d in dims})) if rank else ()
    if name in ("argmax", "argmin") and len(norm) > 1 and norm != tuple(range(rank)):
        raise Unsupported("argmax over several dims")
    if meta(src).dtype.is_complex:
        raise Unsupported("complex reduction")
    return ReductionInfo(node, src, OPS[name], norm, keepdim)


def reduced_index(info: ReductionInfo, full: Index) -> Index:
    """Index of the reduction's result for row `full` (keepdim: zeros at reduced dims)."""
    if info.keepdim and len(meta(info.node).shape) == len(full):
        return tuple("0" if d in info.dims else e for d, e in enumerate(full))
    if meta(info.node).shape == () and info.dims == tuple(range(len(full))):
        return ()
    return tuple(e for d, e in enumerate(full) if d not in info.dims)


def identity(op: str, dtype: torch.dtype) -> float | int:
    """The value reduction `op` (one of `OPS`' values) starts from in `dtype`: what masked
    lanes hold, and what a split reduction pads with."""
    if op in ("sum", "mean", "any"):
        return 0
    if op in ("prod", "all"):
        return 1
    if dtype.is_floating_point:
        return float("-inf") if op in ("max", "argmax") else float("inf")
    info = torch.iinfo(dtype)
    return info.min if op in ("max", "argmax") else info.max


def _identity(op: str, dtype: torch.dtype) -> str:
    return literal(identity(op, dtype), dtype)


def _acc_dtype(info: ReductionInfo) -> torch.dtype:
    if info.op in ("any", "all"):
        return torch.int32
    if info.op in ("max", "min", "argmax", "argmin"):
        dt = compute_dtype(meta(info.source).dtype)
        return torch.int32 if dt == torch.bool else dt
    return compute_dtype(meta(info.node).dtype)


PROD_HELPER = "@triton.jit\ndef _kiln_prod(a, b):\n    return a * b\n"


class Reducer:
    """Emits accumulation and finalization of one reduction."""

    def __init__(self, w: Writer, info: ReductionInfo, k: int) -> None:
        self.w, self.info, self.k = w, info, k
        self.dtype = _acc_dtype(info)
        self.acc = f"acc{k}"
        self.idx_acc = f"acc{k}_index"

    def value(self, full: Index) -> str:
        w, info = self.w, self.info
        v = w.value(info.source, full, "rowmask")
        if info.op in ("any", "all"):
            v = f"({v} != 0).to(tl.int32)"
        elif compute_dtype(meta(info.source).dtype) != self.dtype:
            v = f"{v}.to({tl_dtype(self.dtype)})"
        return w.tmp(f"tl.where(rowmask, {v}, {_identity(info.op, self.dtype)})")

    @property
    def nan_aware(self) -> bool:
        """Whether NaN needs handling: max/min/argmax/argmin over floating values."""
        return self.info.op in ("max", "min", "argmax", "argmin") and self.dtype.is_floating_point

    def init(self) -> None:
        dt = tl_dtype(self.dtype)
        self.w.emit(f"{self.acc} = tl.full([XBLOCK, RBLOCK], {_identity(self.info.op, self.dtype)}, {dt})")
        if self.info.op in ("argmax", "argmin"):
            self.w.emit(f"{self.idx_acc} = tl.full([XBLOCK, RBLOCK], rnumel, tl.int64)")

    def accumulate(self, v: str) -> None:
        w, op, acc = self.w, self.info.op, self.acc
        if op in ("sum", "mean"):
            w.emit(f"{acc} = {acc} + {v}")
        elif op == "prod":
            w.emit(f"{acc} = {acc} * {v}")
        elif op in ("max", "any", "min", "all"):
            fn = "tl.maximum" if op in ("max", "any") else "tl.minimum"
            nan = ", propagate_nan=tl.PropagateNan.ALL" if self.nan_aware else ""
            w.emit(f"{acc} = {fn}({acc}, {v}{nan})")
        else:
            cmp = ">" if op == "argmax" else "<"
            cond = f"({v} {cmp} {acc}) | (({v} == {acc}) & (rindex < {self.idx_acc}))"
            if self.nan_aware:  # a lane keeps its first NaN: NaN beats any number
                cond += f" | (({v} != {v}) & ({acc} == {acc}))"
            better = w.tmp(cond)
            w.emit(f"{acc} = tl.where({better}, {v}, {acc})")
            w.emit(f"{self.idx_acc} = tl.where({better}, rindex, {self.idx_acc})")

    def finish(self, values: str, indices: str) -> str:
        """Reduce the [XBLOCK, RBLOCK] block `values` to [XBLOCK, 1]."""
        w, op, info = self.w, self.info.op, self.info
        out_dt = compute_dtype(meta(info.node).dtype)
        if op in ("sum", "mean"):
            expr = f"tl.sum({values}, 1)[:, None]"
        elif op == "prod":
            w.helpers.add(PROD_HELPER)
            expr = f"tl.reduce({values}, 1, _kiln_prod)[:, None]"
        elif op in ("max", "any", "min", "all"):
            expr = f"tl.{'max' if op in ('max', 'any') else 'min'}({values}, 1)[:, None]"
            if self.nan_aware:
                expr = f"tl.where({_row_has_nan(values)}, float(\"nan\"), {w.tmp(expr)})"
        elif not self.nan_aware:
            best = w.tmp(f"tl.{'max' if op == 'argmax' else 'min'}({values}, 1)[:, None]")
            expr = f"tl.min(tl.where({values} == {best}, {indices}, rnumel), 1)[:, None]"
        else:
            # One min over a key: NaN lanes rank first (their index), then lanes equal
            # to the best number (index + rnumel), then the rest (2 * rnumel).
            best = w.tmp(f"tl.{'max' if op == 'argmax' else 'min'}({values}, 1)[:, None]")
            key = w.tmp(f"tl.where({values} != {values}, {indices}, tl.where({values} == {best}, "
                        f"{indices} + rnumel, 2 * rnumel))")
            first = w.tmp(f"tl.min({key}, 1)[:, None]")
            expr = f"tl.where({first} >= rnumel, {first} - rnumel, {first})"
        var = w.tmp(expr, prefix=f"red{self.k}_")
        if op == "mean":
            var = w.tmp(f"{var} / {literal(info.domain.rnumel, self.dtype)}" if
                        self.dtype.is_floating_point else f"{var} // {max(info.domain.rnumel, 1)}")
        if op in ("any", "all"):
            var = w.tmp(f"{var} != 0")
        elif compute_dtype(meta(info.node).dtype) != self.dtype:
            var = w.tmp(f"{var}.to({tl_dtype(out_dt)})")
        return var


def _row_has_nan(values: str) -> str:
    """Triton expression: [XBLOCK, 1] true where a row of the block `values` holds a NaN."""
    return f"(tl.max(({values} != {values}).to(tl.int32), 1)[:, None] != 0)"


def _levels(group: KernelGroup, infos: dict[fx.Node, ReductionInfo],
            is_buffer: object) -> dict[fx.Node, int]:
    """Dependency level of each reduction among the group's reductions: one more than the
    highest level it reads through members and inlined values. Each node's highest level
    read is computed once (fusion builds a frame per trial: a walk per reduction made a
    group of n reductions cost n^2 per trial), with a loop, not recursion: chains may be
    thousands of ops long."""
    levels: dict[fx.Node, int] = {}
    members = set(group.members)
    reads: dict[fx.Node, int] = {}  # highest level a node's value reads, -1 for none

    def through(arg: fx.Node) -> bool:  # an evaluated value, not a reduction or a buffer
        return arg not in infos and (arg in members or not is_buffer(arg))  # type: ignore[operator]

    def highest(node: fx.Node) -> int:
        todo = [node]
        while todo:
            n = todo[-1]
            missing = [a for a in n.all_input_nodes if a not in reads and through(a)]
            if missing:
                todo.extend(missing)
                continue
            todo.pop()
            reads[n] = max((levels.get(a, -1) if a in infos else reads[a]
                            for a in n.all_input_nodes if a in infos or through(a)), default=-1)
        return reads[node]

    for node in group.members:
        if node in infos:
            source = infos[node].source
            below = levels.get(source, -1) if source in infos else highest(source)
            levels[node] = 1 + below
    return levels


class RowFrame:
    """A reduction kernel being written: XBLOCK rows per program, each row's reduced
    elements visited RBLOCK at a time. The constructor emits the row prologue; a
    variant's body (`compiler.codegen.kinds.reduction`) opens row loops, reduces each
    dependency level and calls `set_anchor` with each reduction's value; `finish` stores
    the row-shaped members and assembles the module."""

    def __init__(self, group: KernelGroup, writer: Writer, is_buffer: object) -> None:
        self.group, self.w = group, writer
        self.dom = dom = group.domain
        self.shape = shape = dom.shape
        self.infos = infos = {n: reduction_info(n) for n in group.anchors}
        for info in infos.values():
            if info.domain != dom:
                raise NotFusible(f"{info.node.name} reduces another domain")
        self.red_shape = tuple(shape[d] for d in dom.rdims)
        w = writer
        w.emit(f"xnumel = {dom.xnumel}")
        w.emit(f"rnumel = {dom.rnumel}")
        pid = "tl.program_id(0).to(tl.int64)" if w.int64 else "tl.program_id(0)"
        w.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        w.emit("xmask = xindex < xnumel")
        self.xdims = define_dims(w, "xindex", tuple(shape[d] for d in dom.kept), "x")
        w.emit("rbase = tl.arange(0, RBLOCK)[None, :]")
        by_level: dict[int, list[fx.Node]] = {}
        for n, lv in _levels(group, infos, is_buffer).items():
            by_level.setdefault(lv, []).append(n)
        # the reductions by dependency level: each level reads only the levels before it
        self.levels = [by_level[lv] for lv in sorted(by_level)]
        order = sorted(infos, key=group.members.index)
        self.reducers = {n: Reducer(w, infos[n], k) for k, n in enumerate(order)}
        self.full_members = [n for n in group.stored if n not in infos and meta(n).shape == shape]
        self.row_members = [n for n in group.stored if n not in infos and n not in self.full_members]

    def full_index(self, rdims: Index) -> Index:
        """The domain's index from the row's dims (`xdims`) and reduced dims `rdims`."""
        return full_index(self.dom, self.xdims, rdims)

    def row_index(self) -> Index:
        """The domain's index after a row loop (its reduced dims are the loop's rindex)."""
        return self.full_index(("rindex",) * len(self.dom.rdims))

    def open_rows(self, loop: bool) -> Index:
        """Start a loop over the reduced elements (or, not `loop`, cover them in one
        block): the index of the elements it visits."""
        w = self.w
        if loop:
            w.emit("for roffset in range(0, rnumel, RBLOCK):")
            w.push()
            w.emit("rindex = roffset + rbase")
        else:
            w.emit("rindex = rbase")
        w.emit("rmask = rindex < rnumel")
        w.emit("rowmask = xmask & rmask")
        w.row_masks["rowmask"] = "xmask"
        full = self.full_index(define_dims(w, "rindex", self.red_shape, "r"))
        _flat_forms(w, self.dom, full, self.shape)
        return full

    def set_anchor(self, node: fx.Node, var: str, full: Index) -> None:
        """The reduction `node`'s value is `var` for the rows of `full`."""
        self.w.anchors[node] = (reduced_index(self.infos[node], full), var)

    def store_full(self, full: Index) -> None:
        """Store the members as large as the domain, at `full`."""
        for n in self.full_members:
            store(self.w, n, full, self.w.value(n, full, "rowmask"), "rowmask")

    def finish(self, comment: list[str]) -> Generated:
        """Store the row-shaped members (reductions included) and assemble the module."""
        w = self.w
        for n in list(self.infos) + self.row_members:
            if n not in self.group.stored:
                continue
            idx = member_row_index(n, self.infos, self.xdims, self.dom)
            store(w, n, idx, w.value(n, idx, "xmask"), "xmask")
        return assemble(w, self.group.stem, comment, ["XBLOCK", "RBLOCK"])


def full_index(dom: Domain, xdims: Index, rdims: Index) -> Index:
    """The domain's index from a row's dims `xdims` and reduced dims `rdims`."""
    out, xi, ri = [], iter(xdims), iter(rdims)
    for d in range(len(dom.shape)):
        out.append(next(ri) if d in dom.rdims else next(xi))
    return tuple(out)


def frame_indices(dom: Domain) -> tuple[Index, Index, Index]:
    """The indices a row frame of `dom` names, without writing it: its rows' dims
    (`xdims`), the index of the elements a row loop visits, and the index after the loop
    (where the reductions' values are set)."""
    xdims = dim_names("xindex", tuple(dom.shape[d] for d in dom.kept), "x")
    red_shape = tuple(dom.shape[d] for d in dom.rdims)
    return (xdims, full_index(dom, xdims, dim_names("rindex", red_shape, "r")),
            full_index(dom, xdims, ("rindex",) * len(dom.rdims)))


def member_row_index(n: fx.Node, infos: dict, xdims: Index, dom: Domain) -> Index:
    """Natural index of a row-domain member `n` (a reduction of `infos`, or a value of a
    row's shape, keepdim or not) in a frame of `dom` whose rows' dims are `xdims`."""
    full = []
    xi = iter(xdims)
    for d in range(len(dom.shape)):
        full.append("0" if d in dom.rdims else next(xi))
    if n in infos:
        return reduced_index(infos[n], tuple(full))
    m = meta(n).shape
    keep, drop = row_shapes(dom)
    if m == keep:
        return tuple(full)
    if m == drop:
        return tuple(e for d, e in enumerate(full) if d not in dom.rdims)
    raise NotFusible(f"{n.name} has shape {m}, not a row of {dom.shape}")


def row_shapes(dom: Domain) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of a row of `dom`: its reduced dims kept as 1 (keepdim), and dropped."""
    keep = tuple(1 if d in dom.rdims else s for d, s in enumerate(dom.shape))
    drop = tuple(s for d, s in enumerate(dom.shape) if d not in dom.rdims)
    return keep, drop


def _flat_forms(w: Writer, dom: Domain, full: Index, shape: tuple) -> None:
    n = len(shape)
    r = len(dom.rdims)
    if dom.rdims == tuple(range(n - r, n)):
        flat = "rindex" if dom.xnumel == 1 else f"xindex * {dom.rnumel} + rindex"
    elif dom.rdims == tuple(range(r)):
        flat = "xindex" if dom.rnumel == 1 else f"rindex * {dom.xnumel} + xindex"
    else:
        return
    w.flat_forms[(full, shape)] = flat
    keep = tuple(1 if d in dom.rdims else s for d, s in enumerate(shape))
    row = tuple("0" if d in dom.rdims else e for d, e in enumerate(full))
    w.flat_forms[(row, keep)] = "xindex"
    w.flat_forms[(tuple(e for d, e in enumerate(full) if d not in dom.rdims),
                  tuple(s for d, s in enumerate(shape) if d not in dom.rdims))] = "xindex"
