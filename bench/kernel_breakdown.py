"""Where a compiled step's GPU time goes, kernel by kernel and by kind of kernel, and where
the GPU waits for the host: one path beside another.

    python -m bench.kernel_breakdown --cases vit_b16.train,resnet18.train \\
        --paths kiln_heuristic,inductor_ro --out breakdown.json

Per case and path (one after the other in this process, dynamo reset between them; KILN_URL
is the caller's to set): a warm-up (compiles, CUDA graph captures), then `--steps` steps
under torch.profiler. Written: GPU us per step; per kernel name its launches and us per
step; the same summed by kind (`CATEGORIES`: library matmuls, convolutions, attention,
layout conversions, copies, Triton kernels, other ATen kernels, memsets and memcpys); one
step's kernels in order; and the idle gaps of that step (the GPU waiting longer than
`--gap-us` between two kernels), each with the host ops running when it ended. Printed: the
kinds side by side. A GPU is needed; the figures are the profiler's, not wall time
(`bench.model_suite` measures that).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.measure import LAYOUT_CONVERSIONS, PROFILER_MARKERS

# Triton kernels by their names' start (kiln's `fused_`, Inductor's `triton_`), since those
# name the ops they fuse ("convolution", "copy"); then the other kinds, first match wins
# (lower-cased substrings of the kernel's name): cuDNN's attention before its convolutions.
TRITON_PREFIXES = ("fused_", "triton_")
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("memcpy", ("memcpy",)),
    ("memset", ("memset",)),
    ("layout conversion", tuple(name.lower() for name in LAYOUT_CONVERSIONS)),
    ("attention", ("flash", "fmha", "sdpa", "attention", "dot_do_o", "convert_dq")),
    ("convolution", ("conv", "dgrad", "wgrad", "fprop", "cudnn")),
    ("library matmul", ("nvjet", "gemm", "cublas")),
    ("copy", ("copy",)),
)


class Kernel(NamedTuple):
    name: str
    start_us: float
    duration_us: float


class HostOp(NamedTuple):
    name: str
    start_us: float
    end_us: float


def category(name: str) -> str:
    """The kind of kernel `name` is (`CATEGORIES`), else "aten other"."""
    lower = name.lower()
    if lower.startswith(TRITON_PREFIXES):
        return "triton"
    for label, needles in CATEGORIES:
        if any(n in lower for n in needles):
            return label
    return "aten other"


def breakdown(kernels: Sequence[Kernel], steps: int) -> dict[str, Any]:
    """Per step: GPU us, and per kernel name and per kind, launches and us."""
    per_name: dict[str, list[float]] = {}
    for k in kernels:
        entry = per_name.setdefault(k.name, [0.0, 0.0])
        entry[0] += 1
        entry[1] += k.duration_us
    by_kind: dict[str, list[float]] = {}
    for name, (count, us) in per_name.items():
        entry = by_kind.setdefault(category(name), [0.0, 0.0])
        entry[0] += count
        entry[1] += us

    def per_step(table: dict[str, list[float]]) -> dict[str, dict[str, float]]:
        rows = sorted(table.items(), key=lambda kv: -kv[1][1])
        return {key: {"launches": round(c / steps, 2), "us": round(us / steps, 2)}
                for key, (c, us) in rows}

    return {"gpu_us": round(sum(k.duration_us for k in kernels) / steps, 1),
            "by_kind": per_step(by_kind), "kernels": per_step(per_name)}


def idle_gaps(kernels: Sequence[Kernel], host: Sequence[HostOp], min_us: float
              ) -> list[dict[str, Any]]:
    """Each wait longer than `min_us` between consecutive kernels (in start order): its
    length, the kernels on either side, and the host ops open when the next kernel started
    (outermost first: what the host was doing while the GPU waited)."""
    ordered = sorted(kernels, key=lambda k: k.start_us)
    gaps = []
    for before, after in zip(ordered, ordered[1:], strict=False):
        wait = after.start_us - (before.start_us + before.duration_us)
        if wait <= min_us:
            continue
        open_ops = [op for op in host if op.start_us <= after.start_us <= op.end_us]
        open_ops.sort(key=lambda op: (op.start_us, -op.end_us))
        gaps.append({"us": round(wait, 1), "after": before.name[:80], "before": after.name[:80],
                     "host": [op.name[:80] for op in open_ops]})
    return gaps


def profile_path(model: str, step: str, path: str, steps: int, warmup: int, gap_us: float
                 ) -> dict[str, Any]:
    """One case on one path (module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.measure import synchronizer
    from bench.models import compiled, instantiate, step_fn

    device = torch.device("cuda")
    sync = synchronizer(device)
    case, module, inputs = instantiate(model, device, False)
    run = step_fn(case, step, compiled(path, module), inputs)
    for _ in range(warmup):
        run()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("kernel_breakdown.step"):
                run()
        sync()
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = prof.events()
    kernels = [Kernel(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in events
               if e.device_type == cuda and e.name not in PROFILER_MARKERS]
    host = [HostOp(e.name, e.time_range.start, e.time_range.end) for e in events
            if e.device_type == cpu]
    marks = sorted((op for op in host if op.name == "kernel_breakdown.step"),
                   key=lambda op: op.start_us)
    last = marks[-1]
    in_last = [k for k in kernels if last.start_us <= k.start_us]
    result = breakdown(kernels, steps)
    result["step"] = [[k.name[:120], round(k.duration_us, 2)]
                      for k in sorted(in_last, key=lambda k: k.start_us)]
    result["gaps"] = idle_gaps(in_last, [op for op in host if op is not last], gap_us)
    del run, module, inputs
    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return result


def side_by_side(results: dict[str, dict[str, Any]], case: str, paths: Sequence[str]) -> str:
    """The kinds of one case, us per step (launches), one column per path."""
    kinds = sorted({kind for p in paths for kind in results[f"{case}/{p}"].get("by_kind", {})})
    lines = [f"{case}: " + "  ".join(f"{p} {results[f'{case}/{p}'].get('gpu_us')} us"
                                     for p in paths)]
    for kind in kinds:
        cells = []
        for p in paths:
            row = results[f"{case}/{p}"].get("by_kind", {}).get(kind)
            cells.append(f"{row['us']:9.1f} ({row['launches']:g})" if row else f"{'-':>9}")
        lines.append(f"  {kind:<18}" + "  ".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_breakdown", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", required=True, help="model.step pairs, comma-separated")
    parser.add_argument("--paths", default="kiln_heuristic,inductor_ro")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--gap-us", type=float, default=20.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        parser.error("a CUDA device is needed: the breakdown is the profiler's kernel times")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for case in cases:
        if case.count(".") != 1:
            parser.error(f"--cases: {case!r} is not model.step")
    results: dict[str, dict[str, Any]] = {}
    for case in cases:
        model, step = case.split(".")
        for path in paths:
            try:
                results[f"{case}/{path}"] = profile_path(model, step, path, args.steps,
                                                          args.warmup, args.gap_us)
            except Exception as exc:  # noqa: BLE001 - one path failing leaves the others
                results[f"{case}/{path}"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            args.out.write_text(json.dumps(results, indent=1) + "\n")
        sys.stdout.write(side_by_side(results, case, paths) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
