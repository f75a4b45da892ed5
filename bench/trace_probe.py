"""Dynamo's first trace of a model after each backend's lookup, in fresh processes.

    python -m bench.trace_probe --model gpt2 --step train --repeat 5
    python -m bench.trace_probe --model resnet18 --device cpu --lookups none,kiln,inductor

A service hit's first step is mostly dynamo's trace of the model, and on an H200 host that
trace took longer in kiln's processes than in Inductor's on some draws (GPT-2 training:
1.14 s against 0.78 s in a single-sample run at 1be3ae2: `git show
295b4e6:bench/results/models_hit_lookup_h200.json`). This separates the trace from
everything a backend compiles: in each fresh process the model is made on the device, one
backend is looked up as `torch.compile` looks it up (`none`: nothing; `kiln`:
`torch.compile(model, backend="kiln")`, which imports kiln's backend and runs its warm-up,
`kiln.warmup.warm_up`, run here also where no GPU makes the import skip it; `inductor`:
`torch.compile(model)`, which makes Inductor's wrapper and imports its compiler), and then the
model's first step runs under `torch.compile` with a backend that returns dynamo's graph
as it is. Printed per lookup: the median over `--repeat` processes (run interleaved, so a
slow stretch of the machine spreads over all) of the lookup's seconds, the first step's,
and dynamo's timers of its trace (`bytecode_tracing`, `get_fake_value`, `create_proxy`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOOKUPS = ("none", "kiln", "inductor")
TIMERS = ("bytecode_tracing", "get_fake_value", "create_proxy")
MARK = "TRACE_PROBE "


def _look_up(lookup: str, module: Any) -> None:
    """What `torch.compile(module, backend=...)` does before any step, for that backend."""
    import torch

    if lookup == "kiln":
        import kiln  # as the model suite names it: no installed entry point needed

        torch.compile(module, backend=kiln.remote_compile)
        from kiln import warmup

        warmup.warm_up()  # where kernels load the import ran it; then this does nothing
    elif lookup == "inductor":
        torch.compile(module)  # Inductor's wrapper: its config and compiler imported


def probe(model: str, step: str, device_name: str, small: bool, lookup: str) -> dict[str, Any]:
    """In this (fresh) process: the lookup's seconds, then the first step's and its timers."""
    import torch
    from torch._dynamo.utils import compile_times

    from bench.measure import first_step, synchronizer
    from bench.models import instantiate, step_fn

    device = torch.device(device_name)
    case, module, inputs = instantiate(model, device, small)
    start = time.perf_counter()
    _look_up(lookup, module)
    looked_up = time.perf_counter() - start
    traced = torch.compile(module, backend=lambda gm, example_inputs: gm.forward)
    _, seconds = first_step(step_fn(case, step, traced, inputs), synchronizer(device))
    names, values = compile_times(repr="csv", aggregate=True)
    timers = dict(zip(names, values, strict=True))
    return {"lookup_s": round(looked_up, 3), "first_s": seconds,
            **{t: round(float(timers[t]), 3) for t in TIMERS if t in timers}}


def main(argv: list[str] | None = None) -> int:
    from bench.models import MODELS, STEPS, missing_package

    parser = argparse.ArgumentParser(prog="python -m bench.trace_probe",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--step", choices=STEPS, default="train")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke runs)")
    parser.add_argument("--lookups", type=lambda s: s.split(","), default=list(LOOKUPS))
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per lookup")
    parser.add_argument("--timeout", type=float, default=600.0, help="per process, s")
    parser.add_argument("--out", type=Path, help="write every sample and the medians as JSON")
    parser.add_argument("--probe", choices=LOOKUPS, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    unknown = sorted(set(args.lookups) - set(LOOKUPS))
    if unknown:
        parser.error(f"unknown lookups {unknown}; choose from {', '.join(LOOKUPS)}")
    needed = missing_package(args.model)
    if needed:
        parser.error(f"--model {args.model} needs the {needed} package")
    if args.probe:
        record = probe(args.model, args.step, args.device, args.small, args.probe)
        print(MARK + json.dumps(record), flush=True)
        return 0
    samples: dict[str, list[dict[str, Any]]] = {lookup: [] for lookup in args.lookups}
    for _ in range(args.repeat):
        for lookup in args.lookups:
            cmd = [sys.executable, "-m", "bench.trace_probe", "--model", args.model, "--step",
                   args.step, "--device", args.device, "--probe", lookup]
            cmd += ["--small"] if args.small else []
            done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                  capture_output=True, text=True, timeout=args.timeout,
                                  check=False)
            found = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
            if done.returncode != 0 or not found:
                print(f"{lookup}: exited {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            samples[lookup].append(json.loads(found[-1][len(MARK):]))
    fields = ("lookup_s", "first_s", *TIMERS)
    medians = {lookup: {f: statistics.median(s[f] for s in runs if f in s) for f in fields
                        if any(f in s for s in runs)}
               for lookup, runs in samples.items()}
    print(f"{args.model}.{args.step} on {args.device}, median of {args.repeat} fresh processes "
          "per lookup (s)")
    print(f"{'lookup':<10}" + "".join(f"{f:>18}" for f in fields))
    for lookup, row in medians.items():
        print(f"{lookup:<10}" + "".join(f"{row.get(f, float('nan')):>18.3f}" for f in fields))
    if args.out:
        import torch

        args.out.write_text(json.dumps({"command": " ".join(["python -m bench.trace_probe",
                                                             *sys.argv[1:]]),
                                        "torch": torch.__version__,
                                        "model": args.model, "step": args.step,
                                        "device": args.device, "medians": medians,
                                        "samples": samples}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
