"""The model benchmark (docs/benchmarks.md's model suite): eager, Inductor and kiln on real models.

    python -m bench.model_suite                         # every model and path, on cuda
    python -m bench.model_suite --models gpt2 --paths eager,kiln_heuristic
    python -m bench.model_suite --cases gpt2.infer,resnet18.train --paths inductor,kiln_heuristic
    TRITON_INTERPRET=1 python -m bench.model_suite --device cpu --small \\
        --models gpt_block_train --paths eager,kiln_heuristic

Each (model, step, path) runs in a fresh process with empty caches (Triton, Inductor,
kiln), so its first step is a cold first step. The project's modules get their bytecode
first, as an installed package has it (`_compile_bytecode`; runs before 2026-12-02 14:00
compiled kiln's modules from source in every process where PYTHONDONTWRITEBYTECODE is set,
as on the H200 machine). Paths:

- `eager`;
- `inductor`: `torch.compile` default;
- `inductor_warm`: the same in a fresh process on the caches the `inductor` run filled (run
  it after `inductor`): its first step is Inductor's warm first step, `inductor_warm_first_s`;
- `inductor_ro`: `torch.compile(mode="reduce-overhead")`: Inductor with CUDA graphs, as kiln
  replays its graphs: the mode kiln's kernels are judged against;
- `inductor_ma` (on request: minutes of compile per model): `mode="max-autotune"`, Inductor's
  template search and CUDA graphs, what a kiln service's tuning is judged against;
- `kiln_heuristic`: `backend="kiln"` with `KILN_URL=off` (heuristic schedules, local builds);
- `kiln_tuned`: `backend="kiln"` against `kiln serve` on this machine after every graph was
  submitted and tuned (bench/flow.py's service and compile phase), from a fresh process with
  empty local caches: a service hit. Its first step is `kiln_hit_first_s`, the kernels it
  compiled (new binaries in its Triton cache, less those fetched from the service)
  `kiln_hit_kernels_compiled`. `--untuned-service` serves the CPU worker's heuristic
  schedules and binaries instead (no GPU worker, no tuning wait: the hit's first step in
  minutes, its step time heuristic). `--hit-variants` measures that hit again in fresh processes
  with other settings (`kiln_hit_variants`: what the first step costs with or without a
  feature).
- `kiln_tuned_noplan` (whenever `kiln_tuned` runs): the same service hit with `KILN_PLANS=0`,
  in a fresh process of its own: the graphs through AOTAutograd instead of their plan, the
  same schedules and kernels (`kiln_tuned_noplan_wall_ms`; `kiln_tuned_vs_noplan` > 1: the
  planned step is the faster).
- `kiln_warm` (on request, with `kiln_tuned`): the hit again in a fresh process on the local
  caches the `kiln_tuned` run filled (schedules, plans, kernel sources, Triton's cache), the
  service still up: a restart on the same node, kiln's counterpart of `inductor_warm`
  (`kiln_warm_first_s`).

`--first-repeats N` measures the warm and hit paths' first steps N times in fresh processes
and records their median (`first_samples`: every sample): one sample varies between
processes about as much as the differences it is read for. With `--paired`, `inductor_warm`
and `kiln_tuned` take turns instead (Inductor's warm process, then kiln's hit, N times, the
service up for both): a slow spell of the host then weighs on both alike, and each case
records the pairs (`hit_pairs`: both samples and kiln's minus Inductor's, with their median).

Per path: wall ms per step, host ms, GPU ms, first step s, the `torch.compile(...)` call
before it s (`compile_call_s`: what looking the backend up imports, Inductor's modules or
kiln's, lands there), kernels compiled by the first
step, dynamo's phase timers of the first step (`dynamo_compile_times`; with
`BENCH_PROFILE_FIRST_STEP=1`, e.g. as a `--hit-variants` entry, a cProfile of it too:
`first_step_profile`; with `BENCH_PY_SPY=<py-spy binary>`, py-spy's samples of every thread
while it holds the GIL, `gil_samples`, bench/gil_samples.py), the modules first imported
during it (`first_step_imports`), each kiln graph's CUDA graph state after the timed steps
(`cuda_graphs`: replays, captures made again, given up, inputs copied in), and the error of the output (inference) or loss and gradients (training) against
eager in the same process. Results: `{"command", "device", "torch", "cases": [...]}`, one
case per (model, step) with the fields the training-speed and compile-time issues name
(`eager_wall_ms`, `inductor_wall_ms`, `kiln_heuristic_wall_ms`, `kiln_tuned_wall_ms`,
`eager_first_s`, `inductor_first_s`, `kiln_first_s`, `kiln_hit_first_s`,
`kiln_hit_kernels_compiled`, ...) and every path's full record under `paths`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT_MARK = "SUITE_RESULT "
PATHS = ("eager", "inductor", "inductor_ro", "inductor_warm", "kiln_heuristic", "kiln_tuned")
# Measured when asked for (--paths): max-autotune compiles for minutes per model.
EXTRA_PATHS = ("inductor_ma", "kiln_warm")
# A warm path is a fresh process on the caches its cold path filled.
WARM_OF = {"inductor_warm": "inductor", "kiln_warm": "kiln_tuned"}
# Paths whose first step --first-repeats measures again (on caches another process filled).
REPEATABLE = ("inductor_warm", "kiln_tuned", "kiln_warm")
TRAIN_ONLY = ("gpt_block_train",)  # models of the set measured as a training step only
# Record key prefix per path in a case (kiln_heuristic's first step is the cold `kiln_first_s`).
FIRST_KEY = {"eager": "eager_first_s", "inductor": "inductor_first_s",
             "inductor_warm": "inductor_warm_first_s", "inductor_ro": "inductor_ro_first_s",
             "inductor_ma": "inductor_ma_first_s",
             "kiln_heuristic": "kiln_first_s", "kiln_tuned": "kiln_hit_first_s",
             "kiln_warm": "kiln_warm_first_s"}
NOPLAN = "kiln_tuned_noplan"  # the service hit without plans, measured beside kiln_tuned
FIRST_KEY[NOPLAN] = "kiln_hit_noplan_first_s"


def _binaries(cache: Path) -> int:
    """Compiled kernel binaries in a Triton cache directory."""
    return sum(1 for p in cache.rglob("*") if p.suffix in (".cubin", ".hsaco")) if cache.exists() else 0


def _fetched_binaries() -> int:
    import kiln

    return int(kiln.stats().get("binaries_fetched", 0))


PROFILE_ENV = "BENCH_PROFILE_FIRST_STEP"  # set (e.g. in a --hit-variants entry): see below
PROFILE_ROWS = 70
PY_SPY_ENV = "BENCH_PY_SPY"  # a py-spy binary: GIL samples of every thread (bench/gil_samples.py)


@contextmanager
def _first_step_profile() -> Iterator[dict[str, Any]]:
    """Where the first step's time goes, into the record: dynamo's phase timers
    (`torch._dynamo.utils.compile_times`: tracing, AOTAutograd, the backend) always; with
    BENCH_PROFILE_FIRST_STEP=1 also the top of a cProfile of the measuring thread by
    cumulative time and by own time (other threads' work shows as waits; the profile slows the step).
    Always the modules first imported during the step (`first_step_imports`, by any thread):
    what a backend's lookup left for the first step to import."""
    from torch._dynamo.utils import compile_times

    found: dict[str, Any] = {}
    imported_before = set(sys.modules)
    profiler = None
    if os.environ.get(PROFILE_ENV) == "1":
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        yield found
    finally:
        if profiler is not None:
            import io
            import pstats

            profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("cumulative").print_stats(PROFILE_ROWS)
            stats.sort_stats("tottime").print_stats(PROFILE_ROWS)
            found["first_step_profile"] = text.getvalue()
        found["dynamo_compile_times"] = compile_times(repr="str", aggregate=True)
        found["first_step_imports"] = sorted(set(sys.modules) - imported_before)


def _kiln_clock() -> float:
    from kiln.degrade import clock

    return clock()


def run_path(model: str, step: str, path: str, device_name: str, small: bool,
             iters: int) -> dict[str, Any]:
    """In a fresh process: one path of one case, measured (see the module doc)."""
    import torch

    from bench.gil_samples import sampled
    from bench.measure import Reference, device_profile, first_step, host_ms, synchronizer, wall_ms
    from bench.models import compiled, instantiate, step_fn

    device = torch.device(device_name)
    sync = synchronizer(device)
    case, module, inputs = instantiate(model, device, small)
    reference = Reference.of(step_fn(case, step, module, inputs), module)
    looked_up = time.perf_counter()  # torch.compile's own call: a backend's imports land here
    compiled_step = step_fn(case, step, compiled(path, module), inputs)
    compile_call_s = round(time.perf_counter() - looked_up, 3)
    cache = Path(os.environ.get("TRITON_CACHE_DIR", "/nonexistent"))
    before = _binaries(cache)
    started = _kiln_clock() if path.startswith("kiln") else None
    with _first_step_profile() as profile, sampled(os.environ.get(PY_SPY_ENV)) as samples:
        got, seconds = first_step(compiled_step, sync)
    # Binaries fetched from the service land in the cache too; they were not compiled here.
    fetched = _fetched_binaries() if path.startswith("kiln") else 0
    record: dict[str, Any] = {"path": path, "first_s": seconds, "compile_call_s": compile_call_s,
                              "kernels_compiled": _binaries(cache) - before - fetched,
                              "binaries_fetched": fetched,
                              **reference.errors(got, module)}
    compiled_step()  # settle: CUDA graph capture, swapped-in schedules
    record["wall_ms"] = wall_ms(compiled_step, sync, iters)
    record["host_ms"] = host_ms(compiled_step, sync, iters)
    record.update(device_profile(compiled_step, sync, min(iters, 5)))
    record.update(profile)
    record.update(samples)
    if path.startswith("kiln"):
        import kiln
        from bench.plan_host_path import graph_states

        record["stats"] = kiln.stats()
        record["cuda_graphs"] = graph_states()  # each graph's replays after the timed steps
        # kiln's compile steps per thread, the first step's start on the same clock
        record["kiln_timeline"] = {"first_step_start": round(started, 4), "steps": kiln.timeline()}
    return record


def _cold_env(workdir: Path, tag: str, extra: dict[str, str]) -> dict[str, str]:
    """The environment of one measuring process: every cache empty and its own."""
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    for var, name in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                      ("KILN_CACHE_DIR", "kiln-cache"), ("KILN_KERNEL_DIR", "kiln-kernels")):
        env[var] = str(workdir / f"{tag}-{name}")
    return env


def _measure(args: argparse.Namespace, workdir: Path, model: str, step: str, path: str,
             extra: dict[str, str], tag: str | None = None) -> dict[str, Any]:
    tag = f"{model}-{step}-{tag or path}"
    cache_tag = f"{model}-{step}-{WARM_OF[path]}" if path in WARM_OF else tag
    cmd = [sys.executable, "-m", "bench.model_suite", "step", "--model", model, "--step", step,
           "--path", path, "--device", args.device, "--iters", str(args.iters)]
    cmd += ["--small"] if args.small else []
    log = workdir / f"{tag}.log"
    with log.open("w") as err:
        done = subprocess.run(cmd, cwd=ROOT, env=_cold_env(workdir, cache_tag, extra),
                              stdout=subprocess.PIPE, stderr=err, text=True,
                              timeout=args.timeout, check=False)
    found = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not found:
        tail = log.read_text()[-600:]
        return {"path": path, "error": f"exited {done.returncode}: {tail}"}
    return json.loads(found[-1][len(RESULT_MARK):])


def _measure_first(args: argparse.Namespace, workdir: Path, model: str, step: str, path: str,
                   extra: dict[str, str]) -> dict[str, Any]:
    """`_measure`; a path whose first step runs on caches another process filled (a warm
    path, a service hit) is measured `--first-repeats` times, each in a fresh process (a hit
    on empty local caches of its own): the first process's record, its `first_s` the median
    of all (`first_samples`, in order). One such first step varies by 0.3-0.5 s between
    processes on an H200 host, as much as the differences it is read for."""
    record = _measure(args, workdir, model, step, path, extra)
    if path not in REPEATABLE or args.first_repeats < 2 or "error" in record:
        return record
    samples = [record["first_s"]]
    for i in range(1, args.first_repeats):
        again = _measure(args, workdir, model, step, path, extra, tag=f"{path}-{i}")
        if "error" in again:
            record.setdefault("repeat_errors", []).append(again["error"][-300:])
        else:
            samples.append(again["first_s"])
    record["first_samples"] = samples
    record["first_s"] = round(statistics.median(samples), 3)
    return record


def _measure_paired(args: argparse.Namespace, workdir: Path, model: str, step: str,
                    hit_env: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """`inductor_warm` and `kiln_tuned` (`hit_env`) measured in turns, `--first-repeats`
    fresh processes each: (Inductor's record, kiln's, the pairs). Each record is its first
    process's, its `first_s` the median of its samples, as `_measure_first` makes them; a
    pair with a failed side is left out of the pairs."""
    records: dict[str, dict[str, Any]] = {}
    pairs: list[tuple[float, float]] = []
    for i in range(max(args.first_repeats, 1)):
        got = {}
        for path, env in (("inductor_warm", {}), ("kiln_tuned", hit_env)):
            again = _measure(args, workdir, model, step, path, env,
                             tag=f"{path}-{i}" if i else None)
            first = records.setdefault(path, again)
            if "error" in again:
                if again is not first:
                    first.setdefault("repeat_errors", []).append(again["error"][-300:])
                continue
            if "error" in first:  # the first process failed: a later one stands for it
                records[path] = first = again
            first.setdefault("first_samples", [])
            first["first_samples"].append(again["first_s"])
            got[path] = again["first_s"]
        if len(got) == 2:
            pairs.append((got["inductor_warm"], got["kiln_tuned"]))
    for record in records.values():
        if record.get("first_samples"):
            record["first_s"] = round(statistics.median(record["first_samples"]), 3)
    differences = [round(k - w, 3) for w, k in pairs]
    summary = {"inductor_warm_s": [w for w, _ in pairs], "kiln_hit_s": [k for _, k in pairs],
               "kiln_minus_inductor_warm_s": differences,
               "median_difference_s": (round(statistics.median(differences), 3)
                                       if differences else None)}
    return records["inductor_warm"], records["kiln_tuned"], summary


def _measure_noplan(args: argparse.Namespace, workdir: Path, model: str, step: str,
                    hit_env: dict[str, str]) -> dict[str, Any]:
    """The service hit (`hit_env`) again in a fresh process on empty local caches with
    `KILN_PLANS=0`: the same schedules and kernels reached through AOTAutograd, the
    baseline a planned step's time is held to (issue 34)."""
    record = _measure(args, workdir, model, step, NOPLAN, {**hit_env, "KILN_PLANS": "0"})
    _progress(model, step, NOPLAN, record)
    return record


def _progress(model: str, step: str, path: str, record: dict[str, Any]) -> None:
    """One measured path, printed as soon as it is known: a run cut short by a time limit
    still shows what it measured."""
    samples = f" {record['first_samples']}" if "first_samples" in record else ""
    print(f"  {model}.{step} {path}: {record.get('wall_ms')} ms/step; first step "
          f"{record.get('first_s')} s{samples}; {record.get('kernels_compiled')} kernels "
          f"compiled", flush=True)


def _case_record(model: str, step: str, paths: dict[str, dict[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {"model": model, "step": step}
    for path, r in paths.items():
        record[f"{path}_wall_ms"] = r.get("wall_ms")
        record[f"{path}_gpu_ms"] = r.get("gpu_ms")
        record[FIRST_KEY[path]] = r.get("first_s")
    if "kiln_tuned" in paths:
        record["kiln_hit_kernels_compiled"] = paths["kiln_tuned"].get("kernels_compiled")
    ratio = _speedup(record.get(f"{NOPLAN}_wall_ms"), record.get("kiln_tuned_wall_ms"))
    if ratio is not None:
        record["kiln_tuned_vs_noplan"] = ratio
    for kiln_path in ("kiln_heuristic", "kiln_tuned"):
        for base in ("eager", "inductor", "inductor_ro", "inductor_ma"):
            ratio = _speedup(record.get(f"{base}_wall_ms"), record.get(f"{kiln_path}_wall_ms"))
            if ratio is not None:
                record[f"{kiln_path}_vs_{base}"] = ratio
    record["paths"] = paths
    return record


def _tuned_service(args: argparse.Namespace, workdir: Path, cases: list[tuple[str, str]]) -> Any:
    """`kiln serve` on this machine with every case's graphs submitted and settled."""
    import torch

    from bench import flow

    gpus = (list(range(torch.cuda.device_count()))
            if args.device.startswith("cuda") and not args.untuned_service else [])
    service = flow.Service(workdir / "service", gpus, None, args.tune_seconds, args.tune_trials)
    flow_args = argparse.Namespace(timeout=args.timeout, device=args.device, iters=1,
                                   small=args.small)
    for model, step in cases:
        flow._client(service, flow_args, model, step, False, workdir / f"submit-{model}-{step}")
    service.graphs = flow._graphs(service, flow._settle(service, args.timeout))
    return service


def _speedup(base_ms: float | None, kiln_ms: float | None) -> float | None:
    """How many times faster kiln's step is than the base's (>1: kiln is faster)."""
    return round(base_ms / kiln_ms, 3) if base_ms and kiln_ms else None


def _geomeans(records: list[dict[str, Any]]) -> dict[str, float]:
    """Geometric mean of each `<kiln path>_vs_<base>` ratio over the cases that have it."""
    keys = sorted({k for r in records for k in r if "_vs_" in k})
    out = {}
    for key in keys:
        values = [r[key] for r in records if key in r]
        out[key] = round(math.exp(sum(math.log(v) for v in values) / len(values)), 3)
    return out


# A case's records of hit measurements beside its paths, kept by a merge as they came.
CASE_EXTRAS = ("kiln_hit_variants", "hit_pairs")


def _merged(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`old` cases with `new` ones laid over them: a (model, step) measured again keeps the
    paths it did not measure this time from `old`, and its `CASE_EXTRAS` unless measured
    again; the summary fields are made again."""
    by_case = {(c["model"], c["step"]): dict(c["paths"]) for c in old}
    extras = {(c["model"], c["step"]): {k: c[k] for k in CASE_EXTRAS if k in c} for c in old}
    for c in new:
        by_case.setdefault((c["model"], c["step"]), {}).update(c["paths"])
        extras.setdefault((c["model"], c["step"]), {}).update(
            {k: c[k] for k in CASE_EXTRAS if k in c})
    return [{**_case_record(m, s, paths), **extras.get((m, s), {})}
            for (m, s), paths in by_case.items()]


# The project's packages, given bytecode before measuring (`_compile_bytecode`).
PACKAGES = ("kiln", "compiler", "tuner", "service", "bench")


def _compile_bytecode() -> None:
    """Bytecode for the project's own modules, as `pip install` writes it for an installed
    package: where PYTHONDONTWRITEBYTECODE is set (the H200 machine sets it), every measuring
    process would otherwise compile kiln's modules from source while torch's and Triton's
    come compiled from their installation, which is no path a user's process takes."""
    import compileall

    for package in PACKAGES:
        compileall.compile_dir(str(ROOT / package), quiet=1)


def _case_list(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (model, step) pairs to measure: --cases, else every --models x --steps pair."""
    return args.cases or [(m, s) for m in args.models for s in args.steps
                          if not (m in TRAIN_ONLY and s == "infer")]


def orchestrate(args: argparse.Namespace) -> int:
    import torch

    from bench.flow import _fmt

    _compile_bytecode()
    cases = _case_list(args)
    workdir = Path(tempfile.mkdtemp(prefix="kiln-models-"))
    print(f"model suite: {len(cases)} cases ({', '.join(f'{m}.{s}' for m, s in cases)}) x "
          f"{len(args.paths)} paths; logs in {workdir}", flush=True)
    results: dict[tuple[str, str], dict[str, dict[str, Any]]] = {c: {} for c in cases}
    hits: dict[tuple[str, str], dict[str, dict[str, Any]]] = {c: {} for c in cases}
    paired = args.paired and {"inductor_warm", "kiln_tuned"} <= set(args.paths)
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    later = ("kiln_tuned", "kiln_warm", "inductor_warm") if paired else ("kiln_tuned", "kiln_warm")
    for model, step in cases:
        for path in (p for p in args.paths if p not in later):
            extra = {"KILN_URL": "off"} if path == "kiln_heuristic" else {}
            results[(model, step)][path] = _measure_first(args, workdir, model, step, path,
                                                          extra)
            _progress(model, step, path, results[(model, step)][path])
    service_graphs: list[dict[str, Any]] = []
    if "kiln_tuned" in args.paths:
        service = _tuned_service(args, workdir, cases)
        service_graphs = service.graphs
        for g in service_graphs:
            print(f"  service: {g['tag']} {g['status']} tune {g['tuning_s']} s; "
                  f"heuristic {g['heuristic_ms']} ms, tuned {g['tuned_ms']} ms; {g['note']}",
                  flush=True)
        try:
            for model, step in cases:
                extra = {"KILN_URL": service.url, "KILN_MODE": "wait",
                         "KILN_WAIT_TIMEOUT": str(args.timeout)}
                found = results[(model, step)]
                if paired:
                    found["inductor_warm"], found["kiln_tuned"], pairs[(model, step)] = \
                        _measure_paired(args, workdir, model, step, extra)
                    _progress(model, step, "inductor_warm", found["inductor_warm"])
                    print(f"  {model}.{step} pairs: kiln minus Inductor warm "
                          f"{pairs[(model, step)]['kiln_minus_inductor_warm_s']} s, median "
                          f"{pairs[(model, step)]['median_difference_s']} s", flush=True)
                else:
                    found["kiln_tuned"] = _measure_first(args, workdir, model, step,
                                                         "kiln_tuned", extra)
                _progress(model, step, "kiln_tuned", found["kiln_tuned"])
                found[NOPLAN] = _measure_noplan(args, workdir, model, step, extra)
                if "kiln_warm" in args.paths:  # the same node again: its caches now filled
                    results[(model, step)]["kiln_warm"] = _measure_first(
                        args, workdir, model, step, "kiln_warm", extra)
                    _progress(model, step, "kiln_warm", results[(model, step)]["kiln_warm"])
                for name, env in args.hit_variants.items():  # the same hit, other settings
                    hits[(model, step)][name] = {"env": env, **_measure(
                        args, workdir, model, step, "kiln_tuned", {**extra, **env},
                        tag=f"hit-{name}")}
        finally:
            service.stop()
    records = [_case_record(m, s, results[(m, s)]) for m, s in cases]
    for record in records:
        variants = hits[(record["model"], record["step"])]
        if variants:
            record["kiln_hit_variants"] = variants
        if (record["model"], record["step"]) in pairs:
            record["hit_pairs"] = pairs[(record["model"], record["step"])]
    if args.merge and args.out and args.out.exists():
        records = _merged(json.loads(args.out.read_text())["cases"], records)
    print(f"\n{'case':<22}" + "".join(f"{p + ' ms':>20}" for p in args.paths)
          + "".join(f"{FIRST_KEY[p]:>24}" for p in args.paths))
    for r in records:
        print(f"{r['model'] + '.' + r['step']:<22}"
              + "".join(f"{_fmt(r.get(p + '_wall_ms')):>20}" for p in args.paths)
              + "".join(f"{_fmt(r.get(FIRST_KEY[p])):>24}" for p in args.paths))
    failed = [f"{r['model']}.{r['step']} {p}: {v['error'][:200]}" for r in records
              for p, v in r["paths"].items() if "error" in v]
    geomeans = _geomeans(records)
    for key, value in geomeans.items():
        print(f"geomean {key}: {value:.3f}x")
    for line in failed:
        print("FAILED", line)
    command = " ".join(["python -m bench.model_suite", *sys.argv[1:]])
    if args.merge and args.out and args.out.exists():
        command = json.loads(args.out.read_text())["command"] + " ; " + command
    result = {"command": command,
              "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "geomeans": geomeans, "cases": records}
    if service_graphs:
        result["service_graphs"] = service_graphs  # each graph's tuning record (kiln_tuned)
        result["service_tuned"] = not args.untuned_service
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 1 if failed else 0


def _variants(text: str) -> dict[str, dict[str, str]]:
    """`name:VAR=V,VAR2=W;other:VAR=X` -> {name: {VAR: V, VAR2: W}, other: {VAR: X}}."""
    variants: dict[str, dict[str, str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, assignments = part.partition(":")
        pairs = [a.partition("=") for a in assignments.split(",") if a.strip()]
        if not sep or not name.strip().isidentifier() or not pairs or any(not eq or not k.strip()
                                                                           for k, eq, _ in pairs):
            raise argparse.ArgumentTypeError(f"expected NAME:VAR=VALUE[,VAR=VALUE], got {part!r}")
        variants[name.strip()] = {k.strip(): v.strip() for k, _, v in pairs}
    return variants


def _cases(text: str) -> list[tuple[str, str]]:
    """`model.step,...` -> [(model, step), ...], each one a case of the set."""
    from bench.models import MODELS, STEPS

    cases = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        model, _, step = part.rpartition(".")
        if model not in MODELS or step not in STEPS or (model in TRAIN_ONLY and step == "infer"):
            raise argparse.ArgumentTypeError(f"{part!r} is not a case: MODEL.STEP with MODEL in "
                                             f"{', '.join(sorted(MODELS))}, STEP in {', '.join(STEPS)}")
        cases.append((model, step))
    return cases


def main(argv: list[str] | None = None) -> int:
    from bench.models import add_case_arguments, missing_package

    parser = argparse.ArgumentParser(prog="python -m bench.model_suite",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    parser.add_argument("--models", type=lambda s: s.split(","),
                        default=["gpt2", "resnet18", "gpt_block_train", "vit_b16", "convnext_tiny"])
    parser.add_argument("--steps", type=lambda s: s.split(","), default=["infer", "train"])
    parser.add_argument("--cases", type=_cases, default=[], metavar="MODEL.STEP,...",
                        help="exactly these cases (e.g. gpt2.infer,resnet18.train) instead of "
                             "every --models x --steps pair")
    parser.add_argument("--paths", type=lambda s: s.split(","), default=list(PATHS))
    parser.add_argument("--merge", action="store_true",
                        help="lay the cases measured now over those already in --out (runs "
                             "split over several calls)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke runs)")
    parser.add_argument("--iters", type=int, default=20, help="steps per timed round")
    parser.add_argument("--tune-seconds", type=float, default=60.0)
    parser.add_argument("--tune-trials", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=1200.0, help="per measuring process, s")
    parser.add_argument("--untuned-service", action="store_true",
                        help="kiln_tuned against a service with no GPU workers: its CPU worker's "
                             "heuristic schedules and binaries, no tuning wait (a service hit "
                             "measured in minutes; the step time is then heuristic)")
    parser.add_argument("--hit-variants", type=_variants, default={}, metavar="NAME:VAR=V,...;...",
                        help="with kiln_tuned, measure the service hit again per variant, in a "
                             "fresh process with these environment variables set (e.g. "
                             "'noworkers:KILN_COMPILE_WORKERS=0;nostatic:KILN_STATIC_LAUNCH=off'); "
                             "results under each case's kiln_hit_variants")
    parser.add_argument("--first-repeats", type=int, default=1, metavar="N",
                        help="measure the first step of inductor_warm, kiln_tuned and kiln_warm "
                             "N times, each in a fresh process; their first_s is the median "
                             "(first_samples lists all)")
    parser.add_argument("--paired", action="store_true",
                        help="with inductor_warm and kiln_tuned: measure them in turns, "
                             "--first-repeats pairs of fresh processes (hit_pairs)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "models_h200.json")
    one = sub.add_parser("step", help="(internal) measure one path of one case")
    add_case_arguments(one)
    one.add_argument("--path", required=True, choices=PATHS + EXTRA_PATHS + (NOPLAN,))
    args = parser.parse_args(argv)
    if args.command == "step":
        record = run_path(args.model, args.step, args.path, args.device, args.small, args.iters)
        print(RESULT_MARK + json.dumps(record), flush=True)
        return 0
    unknown = sorted(set(args.paths) - set(PATHS + EXTRA_PATHS))
    if unknown:
        parser.error(f"unknown paths {unknown}; choose from {', '.join(PATHS + EXTRA_PATHS)}")
    if "kiln_warm" in args.paths and "kiln_tuned" not in args.paths:
        parser.error("kiln_warm runs on the caches kiln_tuned fills: add kiln_tuned to --paths")
    missing = sorted({f"{m} needs {package}" for m, _ in _case_list(args)
                      if (package := missing_package(m))})
    if missing:
        parser.error(f"missing packages: {'; '.join(missing)}")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
