"""Pointwise kernels: one program per XBLOCK elements of the output's flat index."""

from __future__ import annotations

import math

from torch import fx

from compiler.codegen.common import Index, NotFusible, reshape_index
from compiler.codegen.writer import Generated, Writer, assemble, define_dims, store
from compiler.ir import KernelGroup, dense_strides, meta


def generate(group: KernelGroup, writer: Writer, comment: list[str],
             members: list[fx.Node] | None = None) -> Generated:
    """A pointwise kernel computing `members` (default: the group's stored members)."""
    w = writer
    shape = group.domain.shape
    w.emit(f"xnumel = {group.domain.xnumel}")
    pid = "tl.program_id(0).to(tl.int64)" if w.int64 else "tl.program_id(0)"
    w.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
    w.emit("xmask = xindex < xnumel")
    order = group.domain.order
    walk = order or tuple(range(len(shape)))  # dims defined in walk order, index in shape order
    walked = define_dims(w, "xindex", tuple(shape[d] for d in walk), "x")
    natural = tuple(walked[walk.index(d)] for d in range(len(shape)))
    w.flat_forms[(natural, shape)] = "xindex"
    if order:  # the flat index is a buffer's offset only where the buffer is dense in `order`
        w.flat_layouts[(natural, shape)] = dense_strides(shape, order)
    for node in members if members is not None else group.stored:
        idx = member_index(w, node, natural, shape, "xindex", ordered=bool(order))
        store(w, node, idx, w.value(node, idx, "xmask"), "xmask")
    return assemble(w, group.stem, comment, ["XBLOCK"])


def member_index(w: Writer, node: fx.Node, natural: Index, shape: tuple[int, ...], flat: str,
                 ordered: bool = False) -> Index:
    """Index of `node` (same element count as the domain, maybe another shape) at the
    domain's `natural` index; its row-major flat offset is the domain's `flat`, unless the
    domain walks another order (`ordered`)."""
    m = meta(node).shape
    if m == shape:
        return natural
    if math.prod(m) != math.prod(shape):
        raise NotFusible(f"{node.name} has shape {m}, kernel {shape}")
    idx = reshape_index(natural, shape, m)
    if not ordered:
        w.flat_forms[(idx, m)] = flat
    return idx

