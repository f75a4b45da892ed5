"""`python -m bench.matmul_table`: the library call against kiln's Triton template, per
matmul shape, on this GPU: the measurements the heuristic's matmul choice is made from.

    python -m bench.matmul_table --out bench/results/matmul_table_h200.json
    python -m bench.matmul_table --emit compiler/codegen/kinds/matmul_table.py \\
        --from bench/results/matmul_table_h200.json

Each shape is a small graph built by kiln twice, once per matmul variant of the schedule:
`aten` (cuBLAS through ATen; the epilogue, if any, a pointwise kernel of its own) and
`triton` (kiln's template, the epilogue fused, the heuristic's config and, as
`triton_alt_ms`, the tuner's usual runner-up tile). Both are timed as whole graphs (CUDA
graph replay, `do_bench` median, L2 flushed), so the epilogue's own kernel counts against the
library call and the template's fused epilogue for it. Shapes: the products of transformer
layers (tokens x model width x MLP width), forward and weight-gradient, with no epilogue,
a bias, and a bias with GELU. `--emit` writes the table module the heuristic reads
(`compiler.codegen.kinds.matmul_table`): one row per shape, the GPU class it was measured on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

EPILOGUES = ("none", "bias", "bias_gelu")
TOKENS = (256, 1024, 4096, 16384)
WIDTHS = ((384, 384), (384, 1536), (1536, 384), (768, 768), (768, 2304), (768, 3072),
          (3072, 768), (1024, 4096), (4096, 1024), (4096, 4096))
# Weight gradients: (out features, in features) summed over K = tokens.
WGRAD_TOKENS = (4096, 16384)
WGRAD = ((768, 768), (768, 3072), (3072, 768), (384, 1536), (4096, 4096))
ALT_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
              "num_stages": 4}


class _Linear(nn.Module):
    """x @ w.T (+ b) (then GELU): a forward product with its epilogue."""

    def __init__(self, k: int, n: int, epilogue: str) -> None:
        super().__init__()
        self.epilogue = epilogue
        self.weight = nn.Parameter(torch.randn(n, k) / k ** 0.5)
        self.bias = nn.Parameter(torch.randn(n)) if epilogue != "none" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return F.gelu(y) if self.epilogue == "bias_gelu" else y


class _WeightGrad(nn.Module):
    """g.T @ x: a weight gradient, K the tokens."""

    def forward(self, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return g.t() @ x


def shapes() -> list[dict[str, Any]]:
    rows = [{"m": m, "n": n, "k": k, "epilogue": e}
            for m, (k, n), e in itertools.product(TOKENS, WIDTHS, EPILOGUES)]
    rows += [{"m": n_out, "n": n_in, "k": t, "epilogue": "none", "wgrad": True}
             for t, (n_out, n_in) in itertools.product(WGRAD_TOKENS, WGRAD)]
    return rows


def _graph(row: dict[str, Any], device: torch.device) -> tuple[Any, list[Any]]:
    from compiler.lowering.tracing import trace_inference

    dt = torch.bfloat16
    if row.get("wgrad"):
        g = torch.randn(row["k"], row["m"], device=device, dtype=dt)
        x = torch.randn(row["k"], row["n"], device=device, dtype=dt)
        return trace_inference(_WeightGrad(), [g, x])
    module = _Linear(row["k"], row["n"], row["epilogue"]).to(device, dt)
    x = torch.randn(row["m"], row["k"], device=device, dtype=dt)
    return trace_inference(module, [x])


def _variants(gm: Any, gi: list[Any], target: Any) -> dict[str, Any]:
    """The graph's builds: `aten`, `triton` (heuristic config), `triton_alt`."""
    import compiler

    base = compiler.heuristic_schedule(gm, target, gi)
    mm = next(k for k in base.kernels if k.kind == "matmul")
    template = dict(mm.config)  # the aten kind keeps the template's heuristic config
    schedules = {
        "aten": base.with_kernel(mm.name, variant="aten", source_hash=None),
        "triton": base.with_kernel(mm.name, variant="triton", config=template, source_hash=None),
        "triton_alt": base.with_kernel(mm.name, variant="triton", source_hash=None,
                                       config=_fit(ALT_CONFIG, mm.sizes)),
    }
    return {name: compiler.build(gm, s, gi) for name, s in schedules.items()}


def _fit(config: dict[str, int], sizes: dict[str, int]) -> dict[str, int]:
    """ALT_CONFIG's tiles clipped to a small product's sizes."""
    from compiler.codegen.kinds.base import next_pow2

    out = dict(config)
    out["BLOCK_M"] = min(out["BLOCK_M"], max(16, next_pow2(sizes["M"])))
    out["BLOCK_N"] = min(out["BLOCK_N"], max(16, next_pow2(sizes["N"])))
    out["BLOCK_K"] = min(out["BLOCK_K"], max(16, next_pow2(sizes["K"])))
    return out


def _time(built: Any, gi: list[Any]) -> float:
    import triton.testing

    built(*gi)
    built(*gi)  # the second call captures the CUDA graph
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(lambda: built(*gi), warmup=20, rep=80,
                                         return_mode="median"))


def measure(device: torch.device) -> dict[str, Any]:
    import compiler
    from compiler import aot
    from compiler.runtime import static_launch

    target = compiler.Target.detect(str(device))
    rows = shapes()
    started = time.perf_counter()
    builds = []
    for row in rows:
        gm, gi = _graph(row, device)
        builds.append((row, gi, _variants(gm, gi, target)))
    # Every kernel of every build compiles at once in the compile workers.
    jobs = [job for _, _, variants in builds for built in variants.values()
            for job in built._compile_jobs(built.launches())]
    static_launch.lazy_driver()
    aot.compile_ahead(jobs, launchers=not static_launch.available())
    print(f"built {len(builds)} shapes x 3 variants, {len(jobs)} kernels compiled in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    while builds:
        row, gi, variants = builds.pop(0)  # each shape's graphs freed once timed
        for name, built in variants.items():
            try:
                built.precompile(device)
                row[f"{name}_ms"] = round(_time(built, gi), 5)
            except Exception as exc:  # noqa: BLE001 - a variant that fails is a data point
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        row["template_config"] = next(k.config for k in variants["triton"].schedule.kernels
                                      if k.kind == "matmul")
        row["winner"] = winner(row)
        print(json.dumps({k: v for k, v in row.items() if k != "template_config"}), flush=True)
    return {"command": " ".join(["python -m bench.matmul_table", *sys.argv[1:]]),
            "device": torch.cuda.get_device_name(device), "arch": target.arch,
            "torch": torch.__version__, "rows": rows}


def winner(row: dict[str, Any]) -> str:
    """`aten` unless the template in the heuristic's config (what a heuristic schedule
    would build) measured faster; `triton_alt_ms` is the tuner's business."""
    lib, tpl = row.get("aten_ms"), row.get("triton_ms")
    if lib is None:
        return "triton"
    return "triton" if tpl is not None and tpl < lib else "aten"


def emit(result: dict[str, Any], path: Path) -> None:
    """The table module the heuristic reads: per shape and epilogue flag (a kernel of its
    own beside the library call: GELU; a bias rides in cuBLAS's addmm), whether the library
    won at least half of that shape's rows."""
    votes: dict[tuple[int, int, int, bool], list[bool]] = {}
    for r in result["rows"]:
        if "aten_ms" in r:
            key = (r["m"], r["n"], r["k"], r["epilogue"] == "bias_gelu")
            votes.setdefault(key, []).append(r["winner"] == "aten")
    rows = sorted((*key, 2 * sum(v) >= len(v)) for key, v in votes.items())
    body = "\n".join(f"    ({m}, {n}, {k}, {e}, {lib})," for m, n, k, e, lib in rows)
    path.write_text(f'''"""Measured matmul choices per GPU class: written by `python -m bench.matmul_table --emit`
from {result.get("source", "a run")} ({result["device"]}, torch {result["torch"]}).

Each row: M, N, K of a bf16 product, whether it has an epilogue kernel beside the library
call (GELU; a bias rides in cuBLAS's addmm), and whether the library call was at least as
fast as kiln's Triton template with the epilogue fused, both timed as whole graphs.
"""

MEASURED: dict[str, tuple[tuple[int, int, int, bool, bool], ...]] = {{"{result["arch"]}": (
{body}
)}}
''')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.matmul_table", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, help="JSON of every row")
    parser.add_argument("--emit", type=Path, help="write the heuristic's table module")
    parser.add_argument("--from", dest="source", type=Path,
                        help="emit from this JSON instead of measuring")
    args = parser.parse_args(argv)
    if args.source:
        result = json.loads(args.source.read_text())
        result["source"] = str(args.source)
    else:
        if not torch.cuda.is_available():
            parser.error("measuring needs a CUDA device (or --from a measured JSON)")
        result = measure(torch.device(args.device))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.emit:
        emit(result, args.emit)
    wins = sum(r.get("winner") == "aten" for r in result["rows"])
    print(f"library at least as fast on {wins} of {len(result['rows'])} shapes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
