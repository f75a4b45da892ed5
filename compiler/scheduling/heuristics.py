"""Configs chosen without measuring: from sizes, dtypes and the target's limits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from compiler.ir import ExternStep, KernelGroup, Program, op_name
from compiler.lowering.frontend import lower_graph
from compiler.scheduling.schedule import KernelChoice, Schedule, next_pow2

PERSISTENT_MAX = 4096  # widest reduced extent (elements) kept in registers by default


def _target_json(target: Any) -> dict[str, Any]:
    if target is None:
        return {}
    if hasattr(target, "to_json"):
        return target.to_json()
    if isinstance(target, dict):
        return dict(target)
    raise TypeError(f"target must be a compiler.Target or its JSON, got {type(target).__name__}")


def _is_gpu(target: dict[str, Any]) -> bool:
    return target.get("device_type", "cpu") != "cpu"


def pointwise_config(xnumel: int, gpu: bool) -> dict[str, int]:
    """1024 elements per program on big tensors; fewer (more programs) on small ones."""
    xblock = min(1024, max(16, next_pow2(xnumel)))
    warps = 4 if xblock >= 512 else 2 if xblock >= 128 else 1
    return {"XBLOCK": xblock, "num_warps": warps if gpu else 1, "num_stages": 1}


def reduction_choice(group: KernelGroup, gpu: bool) -> tuple[str, dict[str, int]]:
    """Variant and config of a reduction: persistent rows when they fit, else looped.
    The heuristic never picks `online` (see below); the tuner may."""
    dom = group.domain
    x, r = dom.xnumel, dom.rnumel
    rblock_full = next_pow2(r)
    elem_bytes = max(group.dtype.itemsize, 4)
    if not dom.inner and r > 1:
        # reduced dims are outer: neighbouring x are contiguous, so give x the wide side
        # enough programs to fill the GPU: about x / 128 columns each, 16 to 64
        xblock = min(next_pow2(x), max(16, min(64, next_pow2(x) // 128)))
        rblock = min(rblock_full, 4096 // xblock, 64 if x >= 64 else 512)
        variant = "persistent" if rblock >= r else "looped"
        return variant, {"XBLOCK": xblock, "RBLOCK": max(rblock, 1), "num_warps": 4 if gpu else 1,
                         "num_stages": 1}
    if rblock_full * elem_bytes <= PERSISTENT_MAX * 4:
        xblock = max(1, min(next_pow2(x), 1024 // rblock_full if rblock_full <= 1024 else 1))
        warps = min(16, max(1, xblock * rblock_full // 512))
        return "persistent", {"XBLOCK": xblock, "RBLOCK": rblock_full,
                              "num_warps": warps if gpu else 1, "num_stages": 1}
    # Wide rows: looped, 4096 at a time. On the H200 (gpu_check sweep, 8192x32000 bf16
    # cross-entropy) this beat the online variant: the second pass over a row hits L2.
    return "looped", {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16 if gpu else 1, "num_stages": 1}


ATEN_MATMUL_FLOPS = 1 << 33  # on GPUs, matmuls this big go to cuBLAS (epilogue: a kernel)


def matmul_choice(group: KernelGroup, gpu: bool) -> tuple[str, dict[str, int]]:
    """The Triton template with tiles sized to the problem and dtype; on a GPU, cuBLAS for
    big matmuls (H200, 8192x4096x4096 bf16 + GELU: 0.42 ms with cuBLAS and an epilogue
    kernel, 0.49-0.62 ms for the template's configs)."""
    shape = group.domain.shape
    m, n, k = shape[-2], shape[-1], group.domain.k
    batch = shape[0] if len(shape) == 3 else 1
    half = group.dtype in (torch.float16, torch.bfloat16)
    big = m >= 1024 and n >= 1024
    bm = min(128, max(16, next_pow2(m)))
    bn = min(256 if (half and big) else 128 if half else 64, max(16, next_pow2(n)))
    bk = min(64 if half else 32, max(16, next_pow2(k)))
    warps = 8 if bm * bn >= 128 * 256 else 4
    stages = (3 if half else 2) if gpu else 1
    variant = "aten" if gpu and 2 * batch * m * n * k >= ATEN_MATMUL_FLOPS else "triton"
    return variant, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                      "num_warps": warps if gpu else 1, "num_stages": stages}


def choose(group: KernelGroup, gpu: bool) -> tuple[str, dict[str, int]]:
    """Heuristic (variant, config) of one kernel."""
    if group.kind == "pointwise":
        return "pointwise", pointwise_config(group.domain.xnumel, gpu)
    if group.kind == "reduction":
        return reduction_choice(group, gpu)
    return matmul_choice(group, gpu)


def schedule_for(program: Program, ghash: str, target: Any) -> Schedule:
    """The heuristic schedule of a lowered program."""
    tj = _target_json(target)
    gpu = _is_gpu(tj)
    kernels = []
    for group in program.kernels:
        variant, config = choose(group, gpu)
        kernels.append(KernelChoice(
            name=group.name, kind=group.kind, variant=variant,
            nodes=tuple(program.origin_names(group.members + group.inlined)),
            sizes=group.sizes, dtype=str(group.dtype).removeprefix("torch."), config=config))
    return Schedule(graph_hash=ghash, target=tj, kernels=tuple(kernels),
                    externs=tuple(sorted(extern_ops(program))))


def extern_ops(program: Program) -> set[str]:
    """Op names of the program's ATen calls (tuple indexing is not a call)."""
    return {op_name(s.node) for s in program.steps
            if isinstance(s, ExternStep) and op_name(s.node) != "operator.getitem"}


def heuristic_schedule(graph: Any, target: Any = None,
                       example_inputs: Sequence[Any] | None = None) -> Schedule:
    """A schedule for `graph` (a `compiler.Graph`, or an fx GraphModule with
    `example_inputs`) on `target`, without measuring anything."""
    program, ghash = lower_graph(graph, example_inputs)
    return schedule_for(program, ghash, target)
