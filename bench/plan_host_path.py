"""Host time per call of a training step's forward and backward, run through AOTAutograd's
runtime and from a plan (issue 34), with stubbed kernels, on any machine:

    python -m bench.plan_host_path                          # GPT blocks, 4 layers, 3 rounds
    python -m bench.plan_host_path --model gpt2 --rounds 5  # HF GPT-2 (needs transformers)

Two paths over the same graphs and the same builds (schedules from one local cache):

- `aot`: the dynamo graph through AOTAutograd (`KILN_PLANS=0`), its runtime wrapper and
  autograd.Function around kiln's compiled forward and backward, as an unplanned process;
- `plan`: the dynamo graph from the plan an earlier process recorded (`kiln.plans`): kiln's
  `PlanRunner` around the same compiled graphs, as a service hit.

Each in two modes: `replay`, CUDA graph replay (`compiler/runtime/cudagraphs.py`) with
stand-in graph objects over CPU tensors (capture runs the graph once, and its outputs are
the graph's memory; a replay launches nothing), which is what a CUDA step runs once its
graphs are captured; `launch`, `KILN_CUDA_GRAPHS=0`, the generated launcher with no-op
kernels. Either way only the Python and the ATen calls around the kernels are timed, on
one intra-op thread (OpenMP workers spinning beside other processes made some processes'
steps 50 times slower on the 2-core CI machine).

Per (path, mode), in `--rounds` fresh processes taken in turns: the median host µs of the
forward call (dynamo's guard and the compiled function) and of the backward call
(`loss.backward()`: the engine, the backward function, gradients accumulated), each the
median over `--steps` steps after `--warmup`; then, over a few counted steps, how many
times per step each graph was called, replayed and run by its launcher, and each graph's
CUDA graph state (replays, captures made again, inputs copied in before a replay). Prints
a table and writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
MARK = "PLAN_HOST_PATH "
PATHS = ("aot", "plan")
MODES = ("replay", "launch")
COUNTED_STEPS = 5


class _NoKernel:
    """A kernel that launches nothing (indexed by its grid, as Triton's are)."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return _nothing


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


class _Stream:
    def wait_stream(self, other: Any) -> None:
        return None


class _Graph:
    """A captured CUDA graph that replays nothing (its kernels are stubbed anyway)."""

    def replay(self) -> None:
        return None


@contextlib.contextmanager
def stand_in_cuda_graphs() -> Iterator[None]:
    """Kernels that launch nothing, and CUDA graph capture and replay on CPU tensors: every
    built graph takes the path a CUDA graph takes (`Built._call` hands each call to its
    `GraphRunner`), a capture runs the graph once on the stream it is given, and a replay
    is free. What remains of a call is its host work around the kernels."""
    import torch

    from compiler.runtime import built, execution

    with contextlib.ExitStack() as stack:
        for owner, name, value in (
                (execution.Launch, "kernel_for", lambda self, device: _NoKernel()),
                (built.Built, "_cuda_inputs", lambda self, inputs: True),
                (torch.cuda, "CUDAGraph", _Graph), (torch.cuda, "Stream", _Stream),
                (torch.cuda, "current_stream", _Stream),
                (torch.cuda, "stream", lambda stream: contextlib.nullcontext()),
                (torch.cuda, "graph",
                 lambda graph, capture_error_mode="global": contextlib.nullcontext())):
            stack.enter_context(mock.patch.object(owner, name, value))
        yield


def graph_states() -> list[dict[str, Any]]:
    """Each graph kiln compiled in this process: its kind, level, where its schedule came
    from, and its CUDA graph runner's state (None where it has none): replays, captures made
    again after a refused replay, whether replay was given up, and how many inputs a replay
    copies in (`staged`) or reads in place (`direct`) and outputs it copies out."""
    from kiln import session

    states = []
    for entry in session.compiled_graphs():
        runner = entry.built._graphs if entry.built is not None else None
        state = None if runner is None else {
            "replays": runner.replays, "recaptures": runner.recaptures, "failed": runner.failed,
            "captured": runner.graph is not None, "staged": len(runner.staged),
            "direct": len(runner.direct), "copied_out": len(runner.copy_at)}
        states.append({"kind": entry.kind, "key": (entry.key or "")[:12], "level": entry.level,
                       "origin": entry.origin, "cuda_graph": state})
    return sorted(states, key=lambda s: s["kind"])


@contextlib.contextmanager
def counted_calls() -> Iterator[dict[str, int]]:
    """Counts, while open, the calls of built graphs (`Built._call`), of their CUDA graph
    runners (and how many of those replayed) and of their generated launchers."""
    from compiler.runtime import built, cudagraphs, launcher

    counts = {"graph_calls": 0, "runner_calls": 0, "replays": 0, "launcher_runs": 0}
    call, run, launch = built.Built._call, cudagraphs.GraphRunner.__call__, \
        launcher.GraphLauncher.__call__

    def counted_call(self: Any, inputs: Any, boxed: bool) -> Any:
        counts["graph_calls"] += 1
        return call(self, inputs, boxed)

    def counted_run(self: Any, inputs: Any) -> Any:
        counts["runner_calls"] += 1
        out = run(self, inputs)
        counts["replays"] += out is not None
        return out

    def counted_launch(self: Any, inputs: Any, boxed: bool) -> Any:
        counts["launcher_runs"] += 1
        return launch(self, inputs, boxed)

    with mock.patch.object(built.Built, "_call", counted_call), \
            mock.patch.object(cudagraphs.GraphRunner, "__call__", counted_run), \
            mock.patch.object(launcher.GraphLauncher, "__call__", counted_launch):
        yield counts


def _model(name: str, layers: int) -> tuple[Any, Any, Callable[[Any, Any], Any]]:
    """(module, input, forward(module, input) -> the tensor the loss is taken of)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(n_layer=layers, n_embd=64, n_head=2, n_positions=64, vocab_size=512,
                            bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0)
        return (GPT2Model(config), torch.randint(0, 512, (2, 16)),
                lambda m, x: m(input_ids=x, use_cache=False).last_hidden_state)
    from bench.cases import GPTBlock

    blocks = nn.Sequential(*[GPTBlock(64, 2) for _ in range(layers)])
    return blocks, torch.randn(2, 16, 64), lambda m, x: m(x)


def measure(model: str, layers: int, mode: str, steps: int, warmup: int) -> dict[str, Any]:
    """In this process: one path (KILN_PLANS says which) in one mode, timed (module doc)."""
    import torch

    import kiln
    from bench.models import loss_of

    if mode == "launch":
        os.environ["KILN_CUDA_GRAPHS"] = "0"
    module, x, forward = _model(model, layers)
    compiled = torch.compile(module, backend=kiln.remote_compile)
    params = list(module.parameters())
    fw_us: list[float] = []
    bw_us: list[float] = []

    def step(timed: bool) -> None:
        for p in params:
            p.grad = None
        start = time.perf_counter()
        out = forward(compiled, x)
        middle = time.perf_counter()
        loss = loss_of(out)
        del out
        before = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        if timed:
            fw_us.append((middle - start) * 1e6)
            bw_us.append((end - before) * 1e6)

    with stand_in_cuda_graphs():
        for _ in range(warmup):
            step(False)
        for _ in range(steps):
            step(True)
        with counted_calls() as counts:
            for _ in range(COUNTED_STEPS):
                step(False)
    stats = kiln.stats()
    return {"forward_us": round(statistics.median(fw_us), 1),
            "backward_us": round(statistics.median(bw_us), 1),
            "per_step": {k: v / COUNTED_STEPS for k, v in counts.items()},
            "graphs": graph_states(), "plans_used": stats.get("plans_used", 0),
            "eager": stats.get("eager", 0)}


def _child(args: argparse.Namespace, cache: Path, path: str, mode: str) -> dict[str, Any]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "KILN_URL": "off", "KILN_CACHE_DIR": str(cache),
           "KILN_KERNEL_DIR": str(cache / "kernels"), "KILN_PLANS": "1" if path == "plan" else "0",
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}  # no intra-op threads to wait on
    cmd = [sys.executable, "-m", "bench.plan_host_path", "measure", "--model", args.model,
           "--layers", str(args.layers), "--mode", mode, "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=args.timeout, check=False)
    found = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{path} {mode} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(found[-1][len(MARK):])


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    """Record the plan and the schedules once, then measure every (path, mode) in turns."""
    cache = Path(tempfile.mkdtemp(prefix="kiln-plan-host-"))
    recorded = _child(args, cache, "plan", "launch")  # no plan yet: AOTAutograd records it
    if recorded["plans_used"]:
        raise RuntimeError("the recording process found a plan in a fresh cache")
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for mode in MODES:
            for path in PATHS:
                got = _child(args, cache, path, mode)
                if got["plans_used"] != int(path == "plan") or got["eager"]:
                    raise RuntimeError(f"{path} {mode}: plans_used {got['plans_used']}, "
                                       f"eager graphs {got['eager']}")
                runs.setdefault(f"{path}.{mode}", []).append(got)
    rows = []
    for name, samples in runs.items():
        path, mode = name.split(".")
        rows.append({"path": path, "mode": mode,
                     "forward_us": round(statistics.median(s["forward_us"] for s in samples), 1),
                     "backward_us": round(statistics.median(s["backward_us"] for s in samples), 1),
                     "forward_samples": [s["forward_us"] for s in samples],
                     "backward_samples": [s["backward_us"] for s in samples],
                     "per_step": samples[0]["per_step"], "graphs": samples[0]["graphs"]})
    import torch

    return {"command": " ".join(["python -m bench.plan_host_path", *sys.argv[1:]]),
            "torch": torch.__version__, "model": args.model, "layers": args.layers,
            "steps": args.steps, "rounds": args.rounds, "rows": rows}


def _table(result: dict[str, Any]) -> str:
    lines = [f"{'path':<6}{'mode':<8}{'forward µs':>12}{'backward µs':>13}{'step µs':>10}"
             f"{'replays/step':>14}{'launcher runs/step':>20}"]
    for row in result["rows"]:
        step = row["per_step"]
        lines.append(f"{row['path']:<6}{row['mode']:<8}{row['forward_us']:>12.1f}"
                     f"{row['backward_us']:>13.1f}{row['forward_us'] + row['backward_us']:>10.1f}"
                     f"{step['replays']:>14.1f}{step['launcher_runs']:>20.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_host_path",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    for p in (parser, one := sub.add_parser("measure", help="(internal) one path and mode")):
        p.add_argument("--model", choices=("gpt_blocks", "gpt2"), default="gpt_blocks")
        p.add_argument("--layers", type=int, default=4)
        p.add_argument("--steps", type=int, default=200, help="timed steps per process")
        p.add_argument("--warmup", type=int, default=20)
    one.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per path and mode")
    parser.add_argument("--timeout", type=float, default=900.0, help="per process, s")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    args = parser.parse_args(argv)
    if args.command == "measure":
        record = measure(args.model, args.layers, args.mode, args.steps, args.warmup)
        print(MARK + json.dumps(record), flush=True)
        return 0
    result = orchestrate(args)
    print(_table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
