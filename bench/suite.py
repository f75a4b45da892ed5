"""`python -m bench.suite`: the kernel suite (docs/benchmarks.md), eager vs Inductor vs kiln,
one table last.

Per case and path: correctness against eager first (a wrong path gets no time), then the
median ms (do_bench, L2 flushed), the time from a cold start to the first compiled call,
and for kiln the tuning time and trials. Copy bandwidth and the bf16 matmul rate are
measured in the same run and give the roofline. `--device cpu` runs the cases at small
shapes on the Triton interpreter: correctness only, never speed.

The JSON record (`bench/results/suite_h200.json` on a GPU unless `--out`; nothing on the CPU
unless `--out`) lists its runs (command, versions, ceilings, commit, time) and one row per
case naming the run it came from. `--merge` lays this run's rows over the file's: a case
measured again replaces its row, the others stay with their runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import sys
import tempfile
import time
from typing import Any

from bench.suite_paths import compiled_path, kiln_path, step, sync, tune_graphs

log = logging.getLogger("bench.suite")


def _cold_caches() -> None:
    """Point every compile cache at a fresh folder so first calls are cold (unless set)."""
    root = tempfile.mkdtemp(prefix="kiln-bench-")
    for var, sub in (
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("TRITON_CACHE_DIR", "triton"),
        ("KILN_KERNEL_DIR", "kiln"),
    ):
        os.environ.setdefault(var, os.path.join(root, sub))


def run_case(
    name: str, args: argparse.Namespace, ceilings: dict[str, float], target: Any, runner: Any
) -> dict:
    """All paths of one case; every failure is recorded in the row, never raised."""
    import torch

    from bench.suite_cases import make_case, roofline_ms
    from tuner.search import Budget
    from tuner.timing import time_fn

    device, small = args.device, args.device == "cpu"
    case = make_case(name, device, small=small)
    row: dict[str, Any] = {"case": name, "kind": case.kind, "errors": {}}
    start = time.perf_counter()
    reference = step(case.module, case)
    sync(device)
    row["eager_first_call_s"] = time.perf_counter() - start
    row["eager_ms"] = time_fn(lambda: step(case.module, case), device).median_ms
    row["eager_repeat_ms"] = time_fn(lambda: step(case.module, case), device).median_ms

    modes = []
    if not small:
        modes.append(("inductor", None))
        if not args.skip_max_autotune and name not in args.skip_max_autotune_for:
            modes.append(("inductor_max_autotune", "max-autotune-no-cudagraphs"))
    for key, mode in modes:
        try:
            got = compiled_path(case, mode, device, reference)
        except Exception as exc:  # a path that fails is a row entry, not a dead bench
            got = {"ms": None, "first_call_s": None, "error": f"{type(exc).__name__}: {exc}"[:400]}
        row[f"{key}_ms"], row[f"{key}_first_call_s"] = got["ms"], got["first_call_s"]
        if got["error"]:
            row["errors"][key] = got["error"]
        torch._dynamo.reset()
    for key in ("inductor", "inductor_max_autotune"):
        row.setdefault(f"{key}_ms", None)

    graphs = None
    try:
        info, graphs = kiln_path(case, device, None, target)
        row["kiln_heuristic_ms"], row["kiln_heuristic_first_call_s"] = (
            info["ms"],
            info["first_call_s"],
        )
        row["kiln_kernels"], row["kiln_fallback_ops"] = (
            info.get("kernels"),
            info.get("fallback_ops"),
        )
        row["kiln_heuristic_graph_ms"] = info.get("graph_ms")
        if info["error"]:
            row["errors"]["kiln_heuristic"] = info["error"]
    except Exception as exc:
        row["kiln_heuristic_ms"] = None
        row["errors"]["kiln_heuristic"] = f"{type(exc).__name__}: {exc}"[:400]
    row["kiln_tuned_ms"], row["tuning_s"], row["trials"] = None, None, None
    if graphs is not None and not args.skip_tuning:
        seconds = args.tune_seconds_gpt if name.startswith("gpt_block") else args.tune_seconds
        budget = Budget(trials=args.tune_trials, seconds=seconds / len(graphs))
        try:
            tuned = tune_graphs(graphs, target, runner, budget, args.strategy)
            row.update(
                tuning_s=tuned["tuning_s"],
                trials=tuned["trials"],
                failed_trials=tuned["failed_trials"],
                tuned_graphs=tuned["graphs"],
                kernels=tuned["kernels"],
            )
            if tuned["tune_errors"]:  # notes (a fallback, a heuristic miss), not failures
                row["tuning_notes"] = tuned["tune_errors"]
            info, _ = kiln_path(case, device, tuned["schedules"], target)
            row["kiln_tuned_ms"], row["kiln_tuned_first_call_s"] = info["ms"], info["first_call_s"]
            row["kiln_tuned_graph_ms"] = info.get("graph_ms")
            if info["error"]:
                row["errors"]["kiln_tuned"] = info["error"]
            elif row.get("kiln_heuristic_ms") and not args.device == "cpu":
                _pair_with_heuristic(row, case, device, tuned["schedules"], target)
        except Exception as exc:
            row["errors"]["kiln_tuned"] = f"{type(exc).__name__}: {exc}"[:400]
    roof = (
        roofline_ms(case, ceilings["copy_bytes_per_s"], ceilings["matmul_flops_per_s"])
        if ceilings
        else None
    )
    row["roofline_ms"] = roof
    best_kiln = row["kiln_tuned_ms"] or row["kiln_heuristic_ms"]
    row["roofline_fraction"] = roof / best_kiln if roof and best_kiln else None
    if not row["errors"]:
        del row["errors"]
    return row


def _pair_with_heuristic(row: dict, case: Any, device: str, schedules: list, target: Any) -> None:
    """Time heuristic and tuned again, back to back, and keep the faster of each pair: a whole
    graph's time drifts over a run, and the first heuristic time was taken minutes earlier."""
    again, _ = kiln_path(case, device, None, target)
    tuned_again, _ = kiln_path(case, device, schedules, target)
    row["kiln_heuristic_first_ms"] = row["kiln_heuristic_ms"]
    if again["ms"] is not None:
        row["kiln_heuristic_ms"] = min(row["kiln_heuristic_ms"], again["ms"])
    if tuned_again["ms"] is not None:
        row["kiln_tuned_ms"] = min(row["kiln_tuned_ms"], tuned_again["ms"])


NOTES = {
    "times": "median ms of do_bench (CUDA events, L2 flushed); training cases time forward+backward",
    "kiln_ms": "sum of the case's graphs run through compiler.build, each verified against the aten graph",
    "first_call_s": (
        "in-process seconds from a cold torch.compile / kiln trace+build to the first result; "
        "caches start empty (fresh TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, KILN_KERNEL_DIR); "
        "kiln_tuned_first_call_s comes after tuning, so its kernels are already compiled"
    ),
    "roofline_ms": "max(bytes moved once / measured copy bandwidth, FLOPs / measured bf16 matmul rate)",
    "tuning_s": "wall seconds of tuner.tune over the case's graphs, child start and baseline included",
    "kiln_heuristic_ms": (
        "faster of the first heuristic time and one taken right after tuning, next to a second "
        "tuned time (kiln_heuristic_first_ms is the first alone)"
    ),
}


def merged(old: dict, new: dict) -> dict:
    """`new`'s rows laid over `old`'s: a case measured again replaces its row, the rest keep
    theirs; each row's `run` indexes `runs`, and a run no row comes from any more is dropped."""
    runs = old["runs"] + new["runs"]
    rows = {r["case"]: r for r in old["cases"]}
    for r in new["cases"]:
        rows[r["case"]] = {**r, "run": r["run"] + len(old["runs"])}
    used = sorted({r["run"] for r in rows.values()})
    renumber = {was: now for now, was in enumerate(used)}
    return {
        **old,
        **new,
        "runs": [runs[i] for i in used],
        "cases": [{**r, "run": renumber[r["run"]]} for r in rows.values()],
    }


def _write(path: str, result: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    os.replace(tmp, path)


def _headline(row: dict) -> dict:
    keys = (
        "eager_ms",
        "inductor_ms",
        "inductor_max_autotune_ms",
        "kiln_heuristic_ms",
        "kiln_tuned_ms",
    )
    return {k: row.get(k) for k in keys}


def summary_table(rows: list[dict]) -> str:
    """The one table printed last: times, roofline fraction, speedups, tuning cost."""
    from tuner.report import fmt_ms, fmt_ratio, geomean, ratio, table

    headers = [
        "case",
        "eager",
        "inductor",
        "ind-m-a",
        "kiln-heur",
        "kiln-tuned",
        "roof%",
        "x eager",
        "x ind",
        "x ind-m-a",
        "tune s",
        "trials",
    ]
    body, vs_eager, vs_ind, vs_ma = [], [], [], []
    for r in rows:
        tuned = r.get("kiln_tuned_ms")
        e, i, m = (
            ratio(r.get(k), tuned) for k in ("eager_ms", "inductor_ms", "inductor_max_autotune_ms")
        )
        vs_eager.append(e)
        vs_ind.append(i)
        vs_ma.append(m)
        frac = r.get("roofline_fraction")
        body.append(
            [
                r["case"],
                fmt_ms(r.get("eager_ms")),
                fmt_ms(r.get("inductor_ms")),
                fmt_ms(r.get("inductor_max_autotune_ms")),
                fmt_ms(r.get("kiln_heuristic_ms")),
                fmt_ms(tuned),
                "-" if frac is None else f"{100 * frac:.0f}%",
                fmt_ratio(e),
                fmt_ratio(i),
                fmt_ratio(m),
                "-" if r.get("tuning_s") is None else f"{r['tuning_s']:.1f}",
                "-" if r.get("trials") is None else str(r["trials"]),
            ]
        )
    body.append(
        [
            "geomean",
            "",
            "",
            "",
            "",
            "",
            "",
            fmt_ratio(geomean(vs_eager)),
            fmt_ratio(geomean(vs_ind)),
            fmt_ratio(geomean(vs_ma)),
            "",
            "",
        ]
    )
    return table(headers, body)


def first_call_table(rows: list[dict]) -> str:
    from tuner.report import table

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    return table(
        ["case", "inductor s", "ind-m-a s", "kiln heur s", "kiln tuned s"],
        [
            [
                r["case"],
                s(r.get("inductor_first_call_s")),
                s(r.get("inductor_max_autotune_first_call_s")),
                s(r.get("kiln_heuristic_first_call_s")),
                s(r.get("kiln_tuned_first_call_s")),
            ]
            for r in rows
        ],
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from bench.suite_cases import CASE_NAMES

    p = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASE_NAMES), help="comma-separated subset")
    p.add_argument(
        "--device", default="cuda", help="cuda (the suite) or cpu (interpreter, correctness)"
    )
    p.add_argument(
        "--skip-max-autotune", action="store_true", help="leave out max-autotune-no-cudagraphs"
    )
    p.add_argument("--skip-max-autotune-for", default="", help="cases to run without max-autotune")
    p.add_argument("--skip-tuning", action="store_true", help="kiln heuristic only")
    p.add_argument("--tune-seconds", type=float, default=15.0, help="tuning budget (s) per case")
    p.add_argument(
        "--tune-seconds-gpt",
        type=float,
        default=60.0,
        help="tuning budget (s) per GPT case, split over its graphs",
    )
    p.add_argument("--tune-trials", type=int, default=None, help="trial budget per graph")
    p.add_argument("--strategy", default="auto", help="auto | exhaustive | coordinate | halving")
    p.add_argument(
        "--out",
        default=None,
        help="JSON output path (default bench/results/suite_h200.json on a GPU, none on the CPU)",
    )
    p.add_argument(
        "--merge", action="store_true", help="lay this run's rows over the --out file's, by case"
    )
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in args.cases if c not in CASE_NAMES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASE_NAMES)}")
    args.skip_max_autotune_for = {c for c in args.skip_max_autotune_for.split(",") if c}
    if args.device == "cpu" and args.tune_trials is None:
        args.tune_trials = 3
    return args


_ENV_TOUCHED = (
    "TRITON_INTERPRET",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "KILN_KERNEL_DIR",
)


def main(argv: list[str] | None = None) -> int:
    """Run the suite; print progress to stderr and the table last to stdout; write JSON."""
    saved = {k: os.environ.get(k) for k in _ENV_TOUCHED}
    try:
        return _main(argv)
    finally:  # leave the caller's environment as it was (tests call main in-process)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    _cold_caches()
    import torch
    import triton

    import compiler
    from tuner.timing import copy_bandwidth, matmul_rate

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for the interpreter check", file=sys.stderr)
        return 2
    target = compiler.Target.detect(args.device)
    ceilings: dict[str, float] = {}
    if args.device.startswith("cuda"):
        ceilings = {
            "copy_bytes_per_s": copy_bandwidth(args.device),
            "matmul_flops_per_s": matmul_rate(args.device),
        }
        log.info(
            "ceilings: copy %.2f TB/s, bf16 matmul %.0f TFLOP/s",
            ceilings["copy_bytes_per_s"] / 1e12,
            ceilings["matmul_flops_per_s"] / 1e12,
        )
    from tuner.runner import Runner

    device_name = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else platform.processor() or "cpu"
    )
    from bench.records import ROOT, stamp

    run = {
        "command": "python -m bench.suite " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": device_name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "ceilings": ceilings,
        "target": target.to_json(),
        **stamp(),
    }
    result = {"notes": NOTES, "runs": [run], "cases": []}
    out = args.out
    if out is None and args.device.startswith("cuda"):
        out = str(ROOT / "bench" / "results" / "suite_h200.json")
    earlier = None
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        if args.merge and os.path.exists(out):
            with open(out) as fh:
                earlier = json.load(fh)
    # One runner child and one compile pool for the whole suite: they start once.
    runner = Runner(args.device)
    rows = result["cases"]
    for name in args.cases:
        log.info("case %s ...", name)
        started = time.perf_counter()
        try:
            row = run_case(name, args, ceilings, target, runner)
        except Exception as exc:
            log.exception("case %s failed", name)
            row = {"case": name, "errors": {"case": f"{type(exc).__name__}: {exc}"[:400]}}
        row["wall_s"] = time.perf_counter() - started
        row["run"] = 0
        rows.append(row)
        if out:  # after every case, so a run cut short keeps what it measured
            _write(out, merged(earlier, result) if earlier else result)
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        log.info("case %s done in %.1f s: %s", name, row["wall_s"], _headline(row))
    runner.close()
    print(first_call_table(rows))
    print()
    print(summary_table(rows))
    if out:
        print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
