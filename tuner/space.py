"""Search spaces of a kernel, pruned by the target's limits before anything compiles.

Each kernel kind (`compiler.codegen.kinds`) owns its space: the product of a few
per-parameter domains, clipped to the kernel's sizes, and its pruning: a point that
cannot fit the target (shared memory, registers, threads per block) is dropped here with
a reason, so no compile is spent on it (Triton's autotuner only learns this after
compiling, one reason Inductor's max-autotune takes minutes per model: docs/benchmarks.md).
A kernel's space is the union over the kinds that can compute its group. The target's
limits are `compiler.codegen.limits`'s, the table the heuristic fits its configs to.
"""

from __future__ import annotations

from typing import Any

from compiler.codegen import kinds
from compiler.codegen.limits import TargetLimits, limits_for
from tuner.records import Candidate

__all__ = ["TargetLimits", "candidates", "limits_for", "neighbours", "prune_reason", "raw_space"]


def prune_reason(
    kind: str,
    variant: str,
    config: dict[str, int],
    sizes: dict[str, int],
    dtype: str,
    limits: TargetLimits,
) -> str | None:
    """Why this config cannot (or should not) run on the target, or None if it may."""
    threads = int(config.get("num_warps", 4)) * 32
    if threads > limits.max_threads:
        return f"{threads} threads per block exceed the target's {limits.max_threads}"
    return kinds.kind_of(kind, variant).prune(variant, config, sizes, dtype, limits)


def raw_space(kernel: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    """Every (variant, config) of a schedule kernel's kind, clipped to its sizes, unpruned."""
    serving = kinds.kinds_for(kernel["kind"])
    if not serving:
        raise ValueError(f"unknown kernel kind {kernel['kind']!r} in kernel {kernel.get('name')!r}")
    return [point for kind in serving for point in kind.space(kernel)]


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
