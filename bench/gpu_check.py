"""`python -m bench.gpu_check`: the kernel suite's cases built with heuristic schedules, checked
against eager, and timed (eager / Inductor default / kiln heuristic) with do_bench.

A quick correctness and heuristic-speed check of the compiler; the full benchmark is
`python -m bench.suite`. On the CPU (`--device cpu`, shrunk shapes, Triton interpreter)
only correctness runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from bench.cases import BenchCase, cases

log = logging.getLogger("bench.gpu_check")
TOL = {torch.float32: 2e-3, torch.bfloat16: 4e-2, torch.float16: 1e-2}


def _bench(fn: Any) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def ceilings() -> dict[str, float]:
    """Device copy bandwidth (bytes read + written per second) and bf16 matmul FLOP/s."""
    src = torch.empty(2**28, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = _bench(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = _bench(lambda: a @ a)
    return {"copy_bytes_per_s": 2 * 2**28 * 4 / (copy_ms * 1e-3),
            "bf16_flops_per_s": 2 * 8192**3 / (mm_ms * 1e-3)}


def _compare(got: Any, want: Any) -> float:
    """Largest error relative to the reference's scale, over all tensor outputs."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if not isinstance(w, torch.Tensor) or w.numel() == 0:
            continue
        if not w.dtype.is_floating_point:
            worst = max(worst, float((g != w).any()))
            continue
        scale = max(1.0, float(w.float().abs().max()))
        err = float((g.float() - w.float()).abs().nan_to_num(float("inf")).max()) / scale
        worst = max(worst, err / TOL.get(w.dtype, 1e-3))
    return worst


def run_case(case: BenchCase, device: torch.device, timing: bool, out_dir: Path | None,
             peaks: dict[str, float], sweep: bool = False) -> dict[str, Any]:
    import compiler
    from compiler.lowering.tracing import trace_inference, trace_training

    torch.manual_seed(0)
    module, inputs = case.make(device)
    target = compiler.Target.detect(str(device))
    row: dict[str, Any] = {"case": case.name}
    graphs = []
    if case.train:
        fwd, bwd, fi, bi = trace_training(module.train(), inputs)
        graphs = [("fwd", fwd, fi), ("bwd", bwd, bi)]
    else:
        module.eval()
        with torch.no_grad():
            gm, gi = trace_inference(module, inputs)
        graphs = [("fwd", gm, gi)]
    builts, build_s, first_s, worst, kernels = [], 0.0, 0.0, 0.0, []
    for tag, gm, gi in graphs:
        t0 = time.perf_counter()
        schedule = compiler.heuristic_schedule(gm, target, gi)
        built = compiler.build(gm, schedule, gi)
        build_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        got = built(*gi)
        if device.type == "cuda":
            torch.cuda.synchronize()
        first_s += time.perf_counter() - t0
        want = gm(*gi)
        want = want if isinstance(want, (tuple, list)) else (want,)
        worst = max(worst, _compare(got, want))
        builts.append((built, gi))
        kernels += [{"graph": tag, "name": k.name, "kind": k.kind, "variant": k.variant,
                     "config": k.config} for k in built.kernels]
        if out_dir is not None:  # every source in one file: few files come back from a run
            path = out_dir / "kernels.json"
            sources = json.loads(path.read_text()) if path.exists() else {}
            sources.update({f"{case.name}.{tag}.{k.name}": k.source for k in built.kernels})
            path.write_text(json.dumps(sources, indent=0))
        row.setdefault("fallback_ops", []).extend(built.fallback_ops)
    row.update(correct=worst <= 1.0, error_vs_tolerance=round(worst, 4), build_s=round(build_s, 3),
               first_call_s=round(first_s, 3), kernels=kernels)
    if not timing:
        return row

    def kiln_step() -> None:
        for built, gi in builts:
            built(*gi)

    if case.train:
        grad = None

        def eager_step(m: Any = module) -> None:
            nonlocal grad
            out = m(*inputs)
            grad = torch.ones_like(out) if grad is None else grad
            out.backward(grad)

        compiled = torch.compile(module)

        def inductor_step() -> None:
            out = compiled(*inputs)
            out.backward(torch.ones_like(out))
    else:
        def eager_step(m: Any = module) -> None:
            with torch.no_grad():
                m(*inputs)

        compiled = torch.compile(module)

        def inductor_step() -> None:
            with torch.no_grad():
                compiled(*inputs)

    row["eager_ms"] = _bench(eager_step)
    t0 = time.perf_counter()
    inductor_step()
    torch.cuda.synchronize()
    row["inductor_first_call_s"] = round(time.perf_counter() - t0, 2)
    row["inductor_ms"] = _bench(inductor_step)
    row["kiln_ms"] = _bench(kiln_step)
    if case.bytes_moved is not None:
        row["roofline_ms"] = case.bytes_moved(inputs) / peaks["copy_bytes_per_s"] * 1e3
    elif case.name == "linear_gelu":
        m, k = inputs[0].shape
        row["roofline_ms"] = 2 * m * k * module.fc.out_features / peaks["bf16_flops_per_s"] * 1e3
    if "roofline_ms" in row:
        row["kiln_pct_roofline"] = round(100 * row["roofline_ms"] / row["kiln_ms"], 1)
        row["eager_pct_roofline"] = round(100 * row["roofline_ms"] / row["eager_ms"], 1)
    row["kiln_speedup_vs_eager"] = round(row["eager_ms"] / row["kiln_ms"], 3)
    replay = max(_compare(built(*gi), _as_tuple(gm(*gi))) for (built, gi), (_, gm, _) in
                 zip(builts, graphs, strict=True))
    row["correct_after_replay"] = replay <= 1.0
    if sweep and not case.train:
        row["sweep"] = sweep_configs(builts[0][0], graphs[0][1], graphs[0][2])
    return row


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _candidates(kind: str, sizes: dict[str, int]) -> list[tuple[str, dict[str, int]]]:
    """A few configs around the heuristic's, to see what the heuristic leaves on the table:
    each kernel kind that can compute the group gives its own (`KernelKind.sweep`)."""
    from compiler.codegen import kinds

    return [point for k in kinds.kinds_for(kind) for point in k.sweep(sizes)]


def sweep_configs(built: Any, gm: Any, gi: list) -> list[dict[str, Any]]:
    """Time each kernel alone under a few alternative configs (kernel_calls + do_bench)."""
    import compiler

    found = []
    for k in built.schedule.kernels:
        for variant, config in _candidates(k.kind, k.sizes):
            entry = {"kernel": k.name, "variant": variant, "config": config}
            try:
                s = built.schedule.with_kernel(k.name, variant=variant, config=config,
                                               source_hash=None)
                calls = compiler.build(gm, s, gi).kernel_calls(*gi)
                call = next(c for c in calls if c.name == k.name)
                entry["ms"] = _bench(call.launch)
            except Exception as exc:  # noqa: BLE001 - a config that fails is a data point
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            found.append(entry)
        heur = next(c for c in built.kernel_calls(*gi) if c.name == k.name)
        found.append({"kernel": k.name, "variant": k.variant, "config": k.config, "heuristic": True,
                      "ms": _bench(heur.launch)})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", default="", help="comma list of case names (default: all)")
    parser.add_argument("--small", action="store_true", help="shrunk shapes (CPU)")
    parser.add_argument("--sweep", default="", help="comma list of cases whose kernels are also "
                        "timed under a few other configs")
    parser.add_argument("--out", default=os.environ.get("OUT", ""), help="directory for JSON + kernels")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device(args.device)
    timing = device.type == "cuda"
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    peaks = ceilings() if timing else {}
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if timing else "cpu",
                               "torch": torch.__version__, "peaks": peaks, "cases": []}
    wanted = {c for c in args.cases.split(",") if c}
    for case in cases(small=args.small or not timing):
        if wanted and case.name not in wanted:
            continue
        try:
            row = run_case(case, device, timing, out_dir, peaks, case.name in args.sweep.split(","))
        except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
            log.exception("case %s failed", case.name)
            row = {"case": case.name, "error": f"{type(exc).__name__}: {exc}"}
        results["cases"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("kernels", "sweep")}), flush=True)
        if out_dir:
            (out_dir / "gpu_check.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    return 0 if all(r.get("correct") for r in results["cases"]) else 1


def print_table(results: dict[str, Any]) -> None:
    """The summary table (ms, % of roofline, speedup over eager)."""
    print(f"\n{results['device']}  peaks: {results['peaks']}")
    print(f"{'case':<18}{'ok':>4}{'eager':>9}{'inductor':>10}{'kiln':>9}{'roof':>8}{'kiln%':>7}"
          f"{'x eager':>9}{'build s':>9}{'1st s':>7}")
    for r in results["cases"]:
        def f(key: str, fmt: str = "{:.3f}", r: dict = r) -> str:
            return fmt.format(r[key]) if key in r else "-"
        print(f"{r['case']:<18}{('yes' if r.get('correct') else 'NO'):>4}{f('eager_ms'):>9}"
              f"{f('inductor_ms'):>10}{f('kiln_ms'):>9}{f('roofline_ms'):>8}"
              f"{f('kiln_pct_roofline', '{:.0f}'):>7}{f('kiln_speedup_vs_eager', '{:.2f}'):>9}"
              f"{f('build_s', '{:.2f}'):>9}{f('first_call_s', '{:.2f}'):>7}")


if __name__ == "__main__":
    raise SystemExit(main())
