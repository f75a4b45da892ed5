"""Matmul kernels (mm, addmm, bmm) with fused pointwise epilogues.

The Triton tutorial's tiled matmul (grouped program order, fp32 accumulator, masked
ragged edges) whose epilogue computes the group's other members from the accumulator
before storing: the `matmul` kind's template (`compiler.codegen.kinds.matmul`). The `aten`
kind (`compiler.codegen.kinds.aten`) runs the matmul as an ATen call instead.
"""

from __future__ import annotations

import torch
from torch import fx

from compiler.codegen import pointwise
from compiler.codegen.common import Unsupported, broadcast_index, literal
from compiler.codegen.writer import Generated, Writer, assemble, store
from compiler.ir import KernelGroup, base_name, meta

OPS = ("mm", "addmm", "bmm")
DOT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def operands(node: fx.Node) -> tuple[fx.Node | None, fx.Node, fx.Node, float, float]:
    """(bias, a, b, alpha, beta) of an mm/addmm/bmm node."""
    name = base_name(node)
    if name == "addmm":
        bias, a, b = node.args[:3]
        return bias, a, b, node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    a, b = node.args[:2]
    return None, a, b, 1, 1


def check(node: fx.Node) -> None:
    """Raise Unsupported when this matmul must stay an ATen call."""
    bias, a, b, _, _ = operands(node)
    da, db, do = meta(a).dtype, meta(b).dtype, meta(node).dtype
    if da != db or da not in DOT_DTYPES or do != da:
        raise Unsupported(f"matmul of {da} x {db}")


def output_index(shape: tuple[int, ...]) -> tuple[tuple[str, ...], str]:
    """The epilogue's index of an output of `shape` ([batch,] M, N): per dim (`rb`, `rm`,
    `rn`), and flat."""
    M, N = shape[-2:]
    if len(shape) == 3:
        return ("rb", "rm", "rn"), f"rb * {M * N} + rm * {N} + rn"
    return ("rm", "rn"), f"rm * {N} + rn"


def generate(group: KernelGroup, writer: Writer, comment: list[str]) -> Generated:
    """The kernel of a matmul group: the template with its epilogue."""
    mm = group.anchors[0]
    w = writer
    bias, a, b, alpha, beta = operands(mm)
    out = meta(mm)
    batched = len(out.shape) == 3
    M, N = out.shape[-2:]
    K = meta(a).shape[-1]
    w.emit(f"M = {M}")
    w.emit(f"N = {N}")
    w.emit(f"K = {K}")
    w.emit("pid = tl.program_id(0)")
    w.emit("num_pid_m = tl.cdiv(M, BLOCK_M)")
    w.emit("num_pid_n = tl.cdiv(N, BLOCK_N)")
    w.emit("num_pid_in_group = GROUP_M * num_pid_n")
    w.emit("first_pid_m = (pid // num_pid_in_group) * GROUP_M")
    w.emit("group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)")
    w.emit("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)")
    w.emit("pid_n = (pid % num_pid_in_group) // group_size_m")
    cast = ".to(tl.int64)" if w.int64 else ""
    w.emit(f"rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){cast}[:, None]")
    w.emit(f"rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){cast}[None, :]")
    lead: tuple[str, ...] = ()
    if batched:
        w.emit(f"rb = tl.program_id(1){cast}")
        lead = ("rb",)
    w.emit("# rows and columns wrap for loads (the tutorial's trick): only stores are masked")
    w.emit("ram = rm % M")
    w.emit("rbn = rn % N")
    w.emit("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
    w.emit("for k0 in range(0, K, BLOCK_K):")
    w.push()
    w.emit("ka = k0 + tl.arange(0, BLOCK_K)[None, :]")
    w.emit("kb = k0 + tl.arange(0, BLOCK_K)[:, None]")
    a_buf, a_off = w.address(a, lead + ("ram", "ka"), block=True)
    b_buf, b_off = w.address(b, lead + ("kb", "rbn"), block=True)
    a_ptr, b_ptr = f"{w.in_param(a_buf)} + ({a_off})", f"{w.in_param(b_buf)} + ({b_off})"
    w.emit(f"if {K} % BLOCK_K == 0:  # static: no mask on K when blocks tile it")
    w.emit(f"    a = tl.load({a_ptr})")
    w.emit(f"    b = tl.load({b_ptr})")
    w.emit("else:")
    w.emit(f"    a = tl.load({a_ptr}, ka < K, other=0.0)")
    w.emit(f"    b = tl.load({b_ptr}, kb < K, other=0.0)")
    precision = ', input_precision="ieee"' if out.dtype == torch.float32 else ""
    w.emit(f"acc = tl.dot(a, b, acc{precision})")
    w.pop()
    w.emit("mmask = (rm < M) & (rn < N)")
    natural, flat = output_index(out.shape)
    value = "acc" if alpha == 1 else f"acc * {literal(alpha, torch.float32)}"
    if bias is not None:
        bv = w.value(bias, broadcast_index(natural, out.shape, meta(bias).shape), "mmask")
        value = f"{value} + {bv}" if beta == 1 else f"{value} + {bv} * {literal(beta, torch.float32)}"
    if value != "acc":
        value = w.tmp(value)
    w.anchors[mm] = (natural, value)
    w.flat_forms[(natural, out.shape)] = flat
    for node in group.stored:
        idx = pointwise.member_index(w, node, natural, out.shape, flat)
        store(w, node, idx, w.value(node, idx, "mmask"), "mmask", block=True)
    return assemble(w, group.stem, comment, ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"])
