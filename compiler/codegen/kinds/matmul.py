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
from compiler.codegen.limits import gpu_limits
from compiler.codegen.writer import Generated
from compiler.ir import Domain, KernelGroup, meta
from compiler.wire.keys import compute_capability

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


# The sm_90 row (H100/H200), from the template timed on an H200 (40 bf16 products of
# 256-16384 tokens, nine tile configs each: compiler/README.md). A product of at least one
# wave of 128x128 tiles (132 SMs) keeps the other classes' tiles, which were the fastest
# of the nine or within 3% there; 128x128x64 over 8 warps and 4 stages was 0-15% slower.
# A product short of one wave leaves SMs idle for the whole kernel: its tiles halve (M
# first, not below 64) until they cover the SMs, over 4 warps and 4 stages (3 when K has
# at most three 64-wide steps): 1.02-1.90x the other rule's speed there (geomean 1.36x). Grouped launch
# order (GROUP_M 8, every row) matters once the tiles outnumber the SMs and run in waves:
# a wave then shares its operands' blocks in L2; within one wave order is moot.
HOPPER_SMS = 132
HOPPER_TILE = 128
HOPPER_MIN_TILE = 64


def config_for(group: KernelGroup, gpu: bool, arch: str = "") -> Config:
    """Tiles sized to the problem, dtype and GPU class `arch`, fitted to its shared memory."""
    shape = group.domain.shape
    m, n, k = shape[-2], shape[-1], group.domain.k
    half = group.dtype in (torch.float16, torch.bfloat16)
    if not gpu:
        return {**_ampere(m, n, k, half), "num_warps": 1, "num_stages": 1}
    batch = group.sizes["batch"]
    config = _hopper(batch, m, n, k, half) if compute_capability(arch) == (9, 0) \
        else _ampere(m, n, k, half)
    return fit(config, dtype_bytes(group.dtype), gpu_limits(arch).shared_memory)


def _ampere(m: int, n: int, k: int, half: bool) -> Config:
    """The row of every GPU class but sm_90, and of the CPU (with one warp, one stage)."""
    big = m >= 1024 and n >= 1024
    bm = min(128, max(16, next_pow2(m)))
    bn = min(256 if (half and big) else 128 if half else 64, max(16, next_pow2(n)))
    bk = min(64 if half else 32, max(16, next_pow2(k)))
    warps = 8 if bm * bn >= 128 * 256 else 4
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
            "num_warps": warps, "num_stages": 3 if half else 2}


def _hopper(batch: int, m: int, n: int, k: int, half: bool) -> Config:
    """The sm_90 row (see HOPPER_SMS)."""
    if batch * cdiv(m, HOPPER_TILE) * cdiv(n, HOPPER_TILE) >= HOPPER_SMS:
        return _ampere(m, n, k, half)
    bm = min(HOPPER_TILE, max(16, next_pow2(m)))
    bn = min(HOPPER_TILE, max(16, next_pow2(n)))
    while batch * cdiv(m, bm) * cdiv(n, bn) < HOPPER_SMS and max(bm, bn) > HOPPER_MIN_TILE:
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": min(64 if half else 32, max(16, next_pow2(k))),
            "GROUP_M": 8, "num_warps": 4, "num_stages": 3 if k <= 3 * 64 else 4}


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes of one element of a matmul operand (`torch.bfloat16` or its name)."""
    return _DTYPE_BYTES.get(str(dtype).removeprefix("torch."), 4)


def shared_memory(config: Config, elem: int) -> int:
    """Bytes of shared memory the pipelined A and B tiles of `config` take (`elem`-byte
    elements, one buffer per stage; the epilogue stores from registers)."""
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    return (bm * bk + bk * bn) * elem * int(config.get("num_stages", 1))


# What a config that overflows shared memory gives up, in order, and how far: stages
# first (a shallower pipeline costs least), then the K step, then the output tile.
_SHRINK = (("num_stages", 2), ("BLOCK_K", 32), ("BLOCK_N", 64), ("BLOCK_M", 64),
           ("num_stages", 1), ("BLOCK_K", 16), ("BLOCK_N", 16), ("BLOCK_M", 16))


def fit(config: Config, elem: int, limit: int) -> Config:
    """`config` shrunk until its tiles fit `limit` bytes of shared memory, and its warps
    cut to what the tile keeps busy (at least four accumulator elements a thread)."""
    cfg = dict(config)
    for key, floor in _SHRINK:
        while shared_memory(cfg, elem) > limit and cfg[key] > floor:
            cfg[key] = cfg[key] - 1 if key == "num_stages" else cfg[key] // 2
    if shared_memory(cfg, elem) > limit:
        raise ValueError(f"no matmul tile fits {limit} B of shared memory")
    cfg["num_warps"] = max(1, min(cfg["num_warps"], cfg["BLOCK_M"] * cfg["BLOCK_N"] // (4 * 32)))
    return cfg


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
        return "triton", config_for(group, gpu, arch)

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
        bm, bn = config["BLOCK_M"], config["BLOCK_N"]
        smem = shared_memory(config, dtype_bytes(dtype))
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
                                       (128, 128, 64, 8, 4), (64, 256, 64, 4, 4),
                                       (64, 128, 64, 4, 4), (64, 64, 64, 4, 4))]

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
        """A value of the output's element count that reads the matmul's result or an
        epilogue member (every member is computed from the result, at its element:
        `can_fuse` follows the reads through them). A tanh-GELU's `x * (1 + tanh(...))`
        reads the stored tanh, not the result."""
        dom = group.domain
        if math.prod(meta(node).shape) != math.prod(dom.shape):
            return None
        if group.anchors[0] not in reads.deps and not reads.deps.intersection(group.members):
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
