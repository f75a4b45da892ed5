"""Search spaces per kernel kind, pruned by the target's limits before anything compiles.

A space is the product of a few per-parameter domains, clipped to the kernel's sizes; a
point that cannot fit the target (shared memory, registers, threads per block) is dropped
here with a reason, so no compile is spent on it (Triton's autotuner only learns this
after compiling, and BENCH.md records Inductor's max-autotune losing minutes that way).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from compiler.scheduling.schedule import WARPS, next_pow2
from compiler.wire.keys import compute_capability
from tuner.records import Candidate


@dataclass(frozen=True)
class TargetLimits:
    """Per-block hardware limits that decide whether a config can launch at all."""

    shared_memory: int  # bytes of shared memory one block may use
    registers_per_thread: int
    registers_per_block: int
    max_threads: int
    # Upper bound on elements one block keeps live; the interpreter is slow past this.
    max_block_elements: int = 1 << 17


# Opt-in shared memory per block by compute capability (CUDA programming guide, table 21).
_SHARED_BY_CC = {(9, 0): 232448, (8, 0): 166912, (8, 7): 166912, (8, 6): 101376, (8, 9): 101376}
CPU_LIMITS = TargetLimits(
    shared_memory=1 << 20,
    registers_per_thread=255,
    registers_per_block=65536,
    max_threads=1024,
    max_block_elements=1 << 14,
)


def limits_for(target: Any) -> TargetLimits:
    """Limits of a `compiler.Target` (or anything with `device_type` and `arch`)."""
    if getattr(target, "device_type", "cpu") != "cuda":
        return CPU_LIMITS
    cc = compute_capability(str(getattr(target, "arch", "sm_80"))) or (8, 0)
    return TargetLimits(
        shared_memory=_SHARED_BY_CC.get(cc, 49152),
        registers_per_thread=255,
        registers_per_block=65536,
        max_threads=1024,
    )


_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}

# Per-parameter domains; clipped per kernel below.
POINTWISE_XBLOCK = (64, 128, 256, 512, 1024, 2048, 4096)
REDUCTION_XBLOCK = (1, 2, 4, 8, 16, 32, 64, 128)
LOOPED_RBLOCK = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
MATMUL_BLOCK_MN = (16, 32, 64, 128, 256)
MATMUL_BLOCK_K = (16, 32, 64, 128)
MATMUL_GROUP_M = (8,)
MATMUL_WARPS = (2, 4, 8)
MATMUL_STAGES = (2, 3, 4, 5)
# Elements a thread may hold live in registers for one tensor of the block; past this it spills.
MAX_ELEMENTS_PER_THREAD = 64
# Accumulator registers a matmul thread may spend (fp32 accumulator, one register each),
# leaving room for addresses and the operand fragments.
MAX_ACC_REGISTERS = 128


def prune_reason(
    kind: str,
    variant: str,
    config: dict[str, int],
    sizes: dict[str, int],
    dtype: str,
    limits: TargetLimits,
) -> str | None:
    """Why this config cannot (or should not) run on the target, or None if it may."""
    warps = int(config.get("num_warps", 4))
    threads = warps * 32
    if threads > limits.max_threads:
        return f"{threads} threads per block exceed the target's {limits.max_threads}"
    if kind == "matmul":
        if variant == "aten":
            return None
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
    xblock = int(config.get("XBLOCK", 1))
    rblock = int(config.get("RBLOCK", 1)) if kind == "reduction" else 1
    elements = xblock * rblock
    if elements > limits.max_block_elements:
        return f"block of {elements} elements exceeds {limits.max_block_elements}"
    if elements // threads > MAX_ELEMENTS_PER_THREAD:
        return f"{elements // threads} elements per thread would spill registers"
    if elements < threads and warps > 1:
        return f"block of {elements} elements leaves {threads} threads idle"
    if kind == "reduction" and variant == "persistent":
        if rblock < sizes.get("rnumel", 1):
            return f"persistent RBLOCK {rblock} is below rnumel {sizes.get('rnumel')}"
    return None


def _clip(domain: tuple[int, ...], upper: int) -> list[int]:
    """Values of a domain up to `upper` (always at least the smallest)."""
    kept = [v for v in domain if v <= upper]
    return kept or [domain[0]]


def raw_space(kernel: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    """Every (variant, config) of a schedule kernel's kind, clipped to its sizes, unpruned."""
    kind, sizes = kernel["kind"], kernel.get("sizes", {})
    stages = int(kernel.get("config", {}).get("num_stages", 1))
    points: list[tuple[str, dict[str, int]]] = []
    if kind == "pointwise":
        xs = _clip(POINTWISE_XBLOCK, max(64, next_pow2(sizes.get("xnumel", 1))))
        for x, w in itertools.product(xs, WARPS):
            points.append(("pointwise", {"XBLOCK": x, "num_warps": w, "num_stages": stages}))
    elif kind == "reduction":
        xnumel, rnumel = sizes.get("xnumel", 1), sizes.get("rnumel", 1)
        xs = _clip(REDUCTION_XBLOCK, next_pow2(xnumel))
        r_full = next_pow2(rnumel)
        variants = ["persistent", "looped"]
        if kernel.get("variant") == "online":
            variants.append("online")
        for variant in variants:
            rs = [r_full] if variant == "persistent" else _clip(LOOPED_RBLOCK, r_full)
            for x, r, w in itertools.product(xs, rs, WARPS):
                cfg = {"XBLOCK": x, "RBLOCK": r, "num_warps": w, "num_stages": stages}
                points.append((variant, cfg))
    elif kind == "matmul":
        points.append(("aten", {}))
        m, n, k = sizes.get("M", 16), sizes.get("N", 16), sizes.get("K", 16)
        bms = _clip(MATMUL_BLOCK_MN, max(16, next_pow2(m)))
        bns = _clip(MATMUL_BLOCK_MN, max(16, next_pow2(n)))
        bks = _clip(MATMUL_BLOCK_K, max(16, next_pow2(k)))
        for bm, bn, bk, g, w, s in itertools.product(
            bms, bns, bks, MATMUL_GROUP_M, MATMUL_WARPS, MATMUL_STAGES
        ):
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g}
            points.append(("triton", {**cfg, "num_warps": w, "num_stages": s}))
    else:
        raise ValueError(f"unknown kernel kind {kind!r} in kernel {kernel.get('name')!r}")
    return points


def candidates(
    kernel: dict[str, Any], target: Any
) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """The kernel's pruned space in fixed order, and what pruning dropped (with reasons).

    `kernel` is one entry of `Schedule.to_json()["kernels"]`. The kernel's own heuristic
    (variant, config) is always kept, so tuning never does worse than the heuristic.
    """
    limits = limits_for(target)
    kept: dict[Candidate, None] = {}
    dropped: list[tuple[Candidate, str]] = []
    heuristic = Candidate.of_kernel(kernel)
    for variant, config in raw_space(kernel):
        cand = Candidate.make(kernel["name"], variant, config)
        reason = prune_reason(
            kernel["kind"],
            variant,
            config,
            kernel.get("sizes", {}),
            kernel.get("dtype", ""),
            limits,
        )
        if reason is None:
            kept[cand] = None
        else:
            dropped.append((cand, reason))
    kept[heuristic] = None
    return sorted(kept, key=Candidate.order_key), dropped


def neighbours(cand: Candidate, space: list[Candidate]) -> list[Candidate]:
    """Points of `space` that differ from `cand` in one parameter by one step (or variant)."""
    by_key = {c: None for c in space}
    out: list[Candidate] = []
    cfg = cand.config
    for key in cfg:
        values = sorted({c.config.get(key) for c in space if c.variant == cand.variant} - {None})
        if cfg[key] not in values:
            continue
        i = values.index(cfg[key])
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                moved = Candidate.make(cand.kernel, cand.variant, {**cfg, key: values[j]})
                if moved in by_key:
                    out.append(moved)
    # Switching variant: the nearest config of each other variant counts as one step.
    for other in sorted({c.variant for c in space} - {cand.variant}):
        pool = [c for c in space if c.variant == other]
        if pool:
            out.append(min(pool, key=lambda c: (_distance(cand, c), c.order_key())))
    return out


def _distance(a: Candidate, b: Candidate) -> int:
    ca, cb = a.config, b.config
    return sum(
        abs(int(ca[k]).bit_length() - int(cb[k]).bit_length()) for k in ca.keys() & cb.keys()
    ) + len(ca.keys() ^ cb.keys())
