"""The matmul kind: the Triton tutorial's tiled matmul with a fused epilogue (template:
`compiler.codegen.matmul`), variant `triton`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from compiler.codegen import matmul
from compiler.codegen.access import Reads
from compiler.codegen.common import reshape_index
from compiler.codegen.kinds.base import (
    BlockLimits,
    Config,
    KernelKind,
    Point,
    cdiv,
    clip,
    next_pow2,
    validate_keys,
    writer,
)
from compiler.codegen.writer import Generated
from compiler.ir import Domain, KernelGroup, meta

# The tuning space's domains; clipped per kernel.
BLOCK_MN = (16, 32, 64, 128, 256)
BLOCK_K = (16, 32, 64, 128)
GROUP_M = (8,)
TUNE_WARPS = (2, 4, 8)
STAGES = (2, 3, 4, 5)
# Accumulator registers a matmul thread may spend (fp32 accumulator, one register each),
# leaving room for addresses and the operand fragments.
MAX_ACC_REGISTERS = 128
_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}


def config_for(group: KernelGroup, gpu: bool) -> Config:
    """Tiles sized to the problem and dtype."""
    shape = group.domain.shape
    m, n, k = shape[-2], shape[-1], group.domain.k
    half = group.dtype in (torch.float16, torch.bfloat16)
    big = m >= 1024 and n >= 1024
    bm = min(128, max(16, next_pow2(m)))
    bn = min(256 if (half and big) else 128 if half else 64, max(16, next_pow2(n)))
    bk = min(64 if half else 32, max(16, next_pow2(k)))
    warps = 8 if bm * bn >= 128 * 256 else 4
    stages = (3 if half else 2) if gpu else 1
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
            "num_warps": warps if gpu else 1, "num_stages": stages}


def matmul_elements(group: KernelGroup) -> int:
    """The largest flat index of a matmul group's output and operands."""
    d = group.domain
    return max(d.xnumel * max(d.rnumel, 1), d.shape[-2] * max(d.k, 1), d.k * d.shape[-1])


class MatmulKind(KernelKind):
    name = "matmul"
    group_kind = "matmul"
    variants = ("triton",)
    tie_order = variants
    config_keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
    anchor_op = "matmul"
    anchor_joins = False  # a matmul starts its kernel: its operands are loaded from memory

    def validate(self, variant: str, config: dict[str, Any], sizes: dict[str, int], name: str) -> None:
        validate_keys(self.config_keys, config, name)
        for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            if not 16 <= config[key] <= 512:
                raise ValueError(f"{name}: {key} must be in 16..512, got {config[key]}")
        if not 1 <= config["GROUP_M"] <= 64:
            raise ValueError(f"{name}: GROUP_M must be in 1..64, got {config['GROUP_M']}")

    def heuristic(self, group: KernelGroup, gpu: bool, arch: str = "") -> Point:
        return "triton", config_for(group, gpu)

    def space(self, kernel: dict[str, Any]) -> list[Point]:
        sizes = kernel.get("sizes", {})
        m, n, k = sizes.get("M", 16), sizes.get("N", 16), sizes.get("K", 16)
        bms = clip(BLOCK_MN, max(16, next_pow2(m)))
        bns = clip(BLOCK_MN, max(16, next_pow2(n)))
        bks = clip(BLOCK_K, max(16, next_pow2(k)))
        points: list[Point] = []
        for bm, bn, bk, g, w, s in itertools.product(bms, bns, bks, GROUP_M, TUNE_WARPS, STAGES):
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g}
            points.append(("triton", {**cfg, "num_warps": w, "num_stages": s}))
        return points

    def prune(self, variant: str, config: Config, sizes: dict[str, int], dtype: str,
              limits: BlockLimits) -> str | None:
        threads = int(config.get("num_warps", 4)) * 32
        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        elem = _DTYPE_BYTES.get(dtype, 4)
        smem = (bm * bk + bk * bn) * elem * int(config.get("num_stages", 1))
        if smem > limits.shared_memory:
            return f"needs {smem} B shared memory, target allows {limits.shared_memory}"
        acc_per_thread = bm * bn // threads
        if acc_per_thread > MAX_ACC_REGISTERS:
            return f"{acc_per_thread} accumulator registers per thread would spill"
        if bm * bn < threads * 4:
            return f"{bm}x{bn} tile leaves {threads} threads mostly idle"
        if bm * bn > limits.max_block_elements:
            return f"{bm}x{bn} tile exceeds {limits.max_block_elements} elements per block"
        return None

    def sweep(self, sizes: dict[str, int]) -> list[Point]:
        return [("triton", {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "num_warps": w,
                            "num_stages": st})
                for m, n, k, w, st in ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
                                       (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
                                       (128, 128, 64, 8, 4), (64, 256, 64, 4, 4))]

    def grid(self, group: KernelGroup, variant: str, config: Config) -> tuple[int, ...]:
        sizes = group.sizes
        return (cdiv(sizes["M"], config["BLOCK_M"]) * cdiv(sizes["N"], config["BLOCK_N"]),
                sizes["batch"])

    def elements(self, group: KernelGroup) -> int:
        return matmul_elements(group)

    def generate(self, group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                 comment: list[str], int64: bool) -> Generated:
        return matmul.generate(group, writer(set(group.members), is_buffer, int64), comment)

    # ---- fusion: a matmul starts a kernel, and takes an epilogue over its output ----

    def start(self, node: fx.Node, name: str, position: int) -> KernelGroup:
        m = meta(node)
        _, a, _, _, _ = matmul.operands(node)
        return KernelGroup(name, self.group_kind, Domain(m.shape, (), meta(a).shape[-1]), [node],
                           position, anchors=[node], dtype=m.dtype)

    def joined(self, group: KernelGroup, node: fx.Node, reads: Reads) -> tuple[str, Domain] | None:
        """A value of the output's element count that reads the matmul's result."""
        dom = group.domain
        if math.prod(meta(node).shape) != math.prod(dom.shape) or group.anchors[0] not in reads.deps:
            return None
        return self.group_kind, dom

    def can_fuse(self, group: KernelGroup, node: fx.Node, reads: Reads) -> bool:
        """The epilogue member reads the accumulator only at its own element."""
        mm = group.anchors[0]
        shape = meta(mm).shape
        natural = matmul.output_index(shape)[0]
        m = meta(node).shape
        idx = natural if m == shape else reshape_index(natural, shape, m)
        return reads.at_own_index(group, node, idx, {mm}, lambda _: natural)


KIND = MatmulKind()
