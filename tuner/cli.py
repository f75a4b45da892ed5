"""`kiln tune MODEL`: compile and tune a model's graphs locally, print a per-kernel table.

MODEL names what to tune, in one of three forms:

- `path/to/model.py` — a Python file defining `model()` (returns an `nn.Module` or a
  function of tensors) and `example_inputs()` (returns a tuple or list of tensors);
- `pkg.module` — an importable module defining the same two functions;
- `pkg.module:factory` (or `model.py:factory`) — `factory()` returns `(model, example_inputs)`.

The model is traced with AOTAutograd (`--train` adds the backward graph), each aten graph
is tuned with `tuner.tune` on `--device` (default: cuda if present, else the CPU with the
Triton interpreter), a progress bar goes to stderr, and the table to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

USAGE_HINT = "define model() and example_inputs(), or pass module:factory returning (model, inputs)"


def load_model(spec: str) -> tuple[Any, list[Any]]:
    """Resolve MODEL (file, module, or module:factory) to (model, example_inputs)."""
    where, _, factory = spec.partition(":")
    if where.endswith(".py") or os.path.sep in where:
        path = Path(where)
        if not path.is_file():
            raise SystemExit(f"kiln tune: no such file {where!r}")
        # The user's own file on their own machine: importing it is what they asked for.
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, str(path.parent.resolve()))
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise SystemExit(f"kiln tune: cannot import {where!r}: {exc}") from exc
    if factory:
        fn = getattr(module, factory, None)
        if not callable(fn):
            raise SystemExit(f"kiln tune: {where!r} has no callable {factory!r}")
        got = fn()
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise SystemExit(f"kiln tune: {factory}() must return (model, example_inputs)")
        model, inputs = got
    else:
        if not (
            callable(getattr(module, "model", None))
            and callable(getattr(module, "example_inputs", None))
        ):
            raise SystemExit(f"kiln tune: {spec!r} does not {USAGE_HINT}")
        model, inputs = module.model(), module.example_inputs()
    return model, list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]


class ProgressBar:
    """A one-line progress bar on stderr, redrawn in place."""

    def __init__(self, graphs: int, stream: Any = None, width: int = 30) -> None:
        self.graphs, self.stream, self.width = graphs, stream or sys.stderr, width
        self.graph = 0
        self.started = time.monotonic()

    def __call__(self, done: int, total: int, kernel: str) -> None:
        frac = (self.graph + (done / total if total else 1.0)) / max(1, self.graphs)
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.started
        self.stream.write(
            f"\r[{bar}] graph {self.graph + 1}/{self.graphs} kernel {min(done + 1, total)}/{total} "
            f"{elapsed:6.1f}s {kernel[:40]:<40}"
        )
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def kernel_rows(graph_label: str, result: Any) -> list[list[str]]:
    """Table rows (one per kernel) of one graph's tuning result."""
    from tuner.report import fmt_ms, fmt_ratio, ratio

    rows = []
    for k in result.kernels:
        rows.append(
            [
                graph_label,
                k.name,
                k.kind,
                fmt_ms(k.heuristic_ms),
                fmt_ms(k.tuned_ms),
                fmt_ratio(ratio(k.heuristic_ms, k.tuned_ms)),
                k.winner.label(),
                str(k.trials),
            ]
        )
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kiln tune", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="model.py | pkg.module | pkg.module:factory (" + USAGE_HINT + ")")
    p.add_argument("--device", default=None, help="cuda[:N] or cpu (default: cuda if available)")
    p.add_argument("--train", action="store_true", help="tune the backward graph too")
    p.add_argument("--trials", type=int, default=None,
                   help="trial budget per graph (default: 50, unbounded with --seconds)")
    p.add_argument("--seconds", type=float, default=None, help="time budget per graph")
    p.add_argument("--strategy", default="auto", help="auto | exhaustive | coordinate | halving")
    p.add_argument("--json", dest="json_out", default=None, help="write every result to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `kiln tune`; returns the process exit code."""
    args = parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import compiler
    from compiler.tracing import trace_inference, trace_training
    from tuner.api import tune
    from tuner.report import fmt_ms, fmt_ratio, ratio, table
    from tuner.search import Budget

    model, inputs = load_model(args.model)
    if hasattr(model, "to"):
        model = model.to(device)
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    if args.train:
        fwd, bwd, fwd_in, bwd_in = trace_training(model, inputs)
        traced = [("forward", fwd, fwd_in), ("backward", bwd, bwd_in)]
    else:
        gm, ins = trace_inference(model, inputs)
        traced = [("forward", gm, ins)]
    target = compiler.Target.detect(device)
    trials = args.trials if args.trials is not None else (None if args.seconds else 50)
    budget = Budget(trials=trials, seconds=args.seconds)
    bar = ProgressBar(len(traced))
    rows, totals, dump = [], [], []
    for i, (label, gm, ins) in enumerate(traced):
        bar.graph = i
        graph = compiler.from_wire(compiler.to_wire(gm, ins))
        result = tune(graph, target, budget, device=device, strategy=args.strategy, progress=bar)
        rows += kernel_rows(label, result)
        totals.append(
            [
                label,
                fmt_ms(result.eager_ms),
                fmt_ms(result.heuristic_ms),
                fmt_ms(result.best_ms),
                fmt_ratio(ratio(result.heuristic_ms, result.best_ms)),
                str(result.trials),
                f"{result.seconds:.1f}",
            ]
        )
        dump.append({"graph": label, **result.to_json()})
    bar.close()
    print(
        table(
            ["graph", "kernel", "kind", "heuristic ms", "tuned ms", "speedup", "config", "trials"],
            rows,
        )
    )
    print()
    print(
        table(
            ["graph", "eager ms", "heuristic ms", "tuned ms", "speedup", "trials", "seconds"],
            totals,
        )
    )
    if device == "cpu":
        print("(cpu: Triton interpreter times; they check the path, not speed)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(dump, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
