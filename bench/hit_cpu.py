"""The CPU side of a service hit, measured on a machine without a GPU.

    python -m bench.hit_cpu                       # resnet18, one training step, 3 fresh processes
    python -m bench.hit_cpu --model gpt --repeat 5 --out hit_cpu.json

On an H200 a fresh client's first step on a service hit is bound, after dynamo, by kiln's
own CPU work, which the GIL serializes across the forward's and the backward's threads
(py-spy samples of resnet18 and GPT-2 hits at b383060: `git show
295b4e6:bench/results/models_hit_preload_h200.json`). This runs that work for real-size graphs on
the CPU, for an sm_90 target, so that it can be measured where there is no GPU to lend:

1. here: one training step of the model is captured with AOTAutograd (kiln's decomposition
   table) and both graphs are written in the wire format;
2. in each of `--repeat` fresh processes, per graph: `from_wire` (the validation a plan's
   parse does), lowering, `build` (code generation and kernel module imports) and
   precompile's front half (Triton's JIT specialisation and cache key of every distinct
   launch, through a stand-in sm_90 driver: what precompile asks before it fetches and
   loads binaries; loading them needs a GPU, so it is not measured).

Prints each phase's CPU seconds per graph (the median over the processes) and the total.
Models: `resnet18` (torchvision's layout in plain torch, bf16, `--batch` x 3 x 224 x 224),
`gpt` (examples/models.py's GPT, 6 layers) and `gpt2` (the model suite's HF GPT-2, 6 x 768,
`--batch` (at most 8) x 512 tokens; needs `transformers`). The cyclic GC is off in the measured
processes, as kiln's `gc_paused` has it while it compiles, and each first looks the backend
up (`kiln.preload`) and has dynamo trace the model's forward at a small batch, as a hit's
process has before kiln's work starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("from_wire", "lower", "build", "specialise")
MARK = "HIT_CPU "


def _resnet18(batch: int, px: int) -> tuple[Any, list[Any]]:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x: Any) -> Any:
            return self.fc(self.layers(self.stem(x)).mean((2, 3)))

    return ResNet18().to(torch.bfloat16), [torch.randn(batch, 3, px, px, dtype=torch.bfloat16)]


def _gpt(batch: int, px: int) -> tuple[Any, list[Any]]:  # noqa: ARG001 - images only
    import torch

    from examples.models import GPT, GPTConfig

    cfg = GPTConfig(layers=6)
    return GPT(cfg), [torch.randint(0, cfg.vocab, (batch, cfg.seq)) for _ in range(2)]


def _hf_gpt2(batch: int, px: int) -> tuple[Any, list[Any]]:  # noqa: ARG001 - images only
    """The model suite's HF GPT-2 (6 x 768, sequence 512, bf16); needs `transformers`."""
    import torch

    from bench.models import MODELS as SUITE
    from bench.models import CaseStep

    module, inputs = SUITE["gpt2"].make(torch.device("cpu"), False)
    return CaseStep(SUITE["gpt2"], module), [inputs[0][:batch]]


# Each model and its inputs, seeded: (batch, image side) -> (module, inputs).
MODELS: dict[str, Callable[[int, int], tuple[Any, list[Any]]]] = {
    "resnet18": _resnet18, "gpt": _gpt, "gpt2": _hf_gpt2}

# Made by bench.models (the package each needs is checked first) and captured through
# dynamo, as the model suite runs them (HF's Python reads tensor values outside it).
SUITE_MODELS = ("gpt2",)


def _seeded(model: str, batch: int, px: int) -> tuple[Any, list[Any]]:
    import torch

    torch.manual_seed(0)
    module, inputs = MODELS[model](batch, px)
    return module.train(), inputs


def capture(model: str, batch: int, out: Path) -> list[str]:
    """Write the model's training forward and backward graphs (wire JSON) under `out`."""
    import compiler
    from compiler.lowering.tracing import trace_training

    fwd, bwd, fwd_in, bwd_in = trace_training(*_seeded(model, batch, 224),
                                              through_dynamo=model in SUITE_MODELS)
    names = []
    for name, gm, example in (("forward", fwd, fwd_in), ("backward", bwd, bwd_in)):
        (out / f"{name}.json").write_text(json.dumps(compiler.to_wire(gm, example)))
        names.append(name)
    return names


def _as_after_dynamo(model: str) -> None:
    """Bring this process where a hit's is when kiln's work starts: the backend looked up
    (`kiln.preload`) and dynamo's trace of the model's forward done (it ran the same ops'
    meta kernels on fake tensors), at a small batch."""
    import torch

    from kiln import preload

    preload.prime_dynamo()
    preload.import_compiler()
    module, inputs = _seeded(model, 1, 64)
    torch.compile(module, backend=lambda gm, example: gm)(*inputs)


def measure(model: str, graphs: list[Path]) -> dict[str, dict[str, float]]:
    """In this (fresh) process: each phase's CPU seconds for each graph, in order."""
    import gc

    from triton.runtime.driver import driver

    import compiler
    from compiler import aot
    from compiler.runtime import triton_key

    _as_after_dynamo(model)
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    compiler.decompositions()  # the backend's warm-up thread builds it before the first step
    driver.set_active(aot.StandInDriver(90))
    triton_key.ensure()  # a child's work on a hit, not the compiling threads'
    aot.backend_hash(driver.active.get_current_target())  # the client's kiln-prepare thread's
    gc.disable()
    return {p.stem: _phases(p.read_text(), target) for p in graphs}


def _phases(text: str, target: Any) -> dict[str, float]:
    import compiler

    times: dict[str, float] = {}

    def timed(phase: str, fn: Callable[[], Any]) -> Any:
        start = time.thread_time()
        value = fn()
        times[phase] = round(time.thread_time() - start, 4)
        return value

    graph = timed("from_wire", lambda: compiler.from_wire(text))
    schedule = timed("lower", lambda: compiler.heuristic_schedule(graph, target))
    built = timed("build", lambda: compiler.build(graph, schedule))
    launches = built.launches()
    jobs = timed("specialise", lambda: built._compile_jobs(launches))
    times["distinct_kernels"] = len(jobs)
    times["launches"] = len(launches)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hit_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="fresh measuring processes")
    parser.add_argument("--out", type=Path, help="write the full figures as JSON")
    parser.add_argument("--measure", nargs="+", type=Path, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    from bench.models import missing_package

    needed = missing_package(args.model) if args.model in SUITE_MODELS else None
    if needed:
        parser.error(f"--model {args.model} needs the {needed} package")
    if args.measure:
        print(MARK + json.dumps(measure(args.model, args.measure)), flush=True)
        return 0
    work = Path(tempfile.mkdtemp(prefix="kiln-hit-cpu-"))
    names = capture(args.model, args.batch, work)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    runs = []
    for i in range(args.repeat):
        env.update(TRITON_CACHE_DIR=str(work / f"triton-{i}"), KILN_KERNEL_DIR=str(work / f"kernels-{i}"))
        done = subprocess.run([sys.executable, "-m", "bench.hit_cpu", "--model", args.model, "--measure",
                               *(str(work / f"{n}.json") for n in names)],
                              cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
        if done.returncode != 0 or not lines:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        runs.append(json.loads(lines[-1][len(MARK):]))
    median = {n: {p: statistics.median(r[n][p] for r in runs) for p in PHASES} for n in names}
    print(f"{args.model}, batch {args.batch}, sm_90, median of {args.repeat} fresh processes "
          "(CPU seconds)")
    print(f"{'graph':<10}" + "".join(f"{p:>12}" for p in PHASES) + f"{'total':>10}{'kernels':>9}")
    for n in names:
        row = median[n]
        print(f"{n:<10}" + "".join(f"{row[p]:>12.3f}" for p in PHASES)
              + f"{sum(row.values()):>10.3f}{runs[0][n]['distinct_kernels']:>9}")
    total = sum(sum(r.values()) for r in median.values())
    print(f"total {total:.3f} s")
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "batch": args.batch,
                                        "median": median, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
