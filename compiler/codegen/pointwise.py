"""Pointwise kernels: one program per XBLOCK elements of the output's flat index."""

from __future__ import annotations

from torch import fx

from compiler.codegen.common import Generated, Writer, assemble, define_dims, store
from compiler.ir import KernelGroup, meta


def generate(group: KernelGroup, writer: Writer, comment: list[str],
             members: list[fx.Node] | None = None) -> Generated:
    """A pointwise kernel computing `members` (default: the group's stored members)."""
    w = writer
    shape = group.domain.shape
    w.emit(f"xnumel = {group.domain.xnumel}")
    pid = "tl.program_id(0).to(tl.int64)" if w.int64 else "tl.program_id(0)"
    w.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
    w.emit("xmask = xindex < xnumel")
    natural = define_dims(w, "xindex", shape, "x")
    w.flat_forms[(natural, shape)] = "xindex"
    for node in members if members is not None else group.stored:
        if meta(node).shape != shape:
            from compiler.codegen.common import NotFusible

            raise NotFusible(f"{node.name} has shape {meta(node).shape}, kernel {shape}")
        var = w.value(node, natural, "xmask")
        store(w, node, natural, var, "xmask")
    return assemble(w, group.name, comment, ["XBLOCK"])
