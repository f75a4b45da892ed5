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
import re
import sys
import time
from pathlib import Path
from typing import Any

STRATEGIES = ("auto", "exhaustive", "coordinate", "halving")  # tuner.search.KernelSearch.run
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
        try:
            module_spec.loader.exec_module(module)
        except SyntaxError as exc:  # the file itself, not what its functions do
            raise _model_error(spec, "loading", exc, hint="") from None
        except Exception as exc:
            raise _model_error(spec, "loading", exc) from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise SystemExit(f"kiln tune: cannot import {where!r}: {exc}") from exc
    if factory:
        fn = getattr(module, factory, None)
        if not callable(fn):
            raise SystemExit(f"kiln tune: {where!r} has no callable {factory!r}")
        try:
            got = fn()
        except Exception as exc:
            raise _model_error(spec, f"calling {factory}() of", exc) from None
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise SystemExit(f"kiln tune: {factory}() must return (model, example_inputs)")
        model, inputs = got
    else:
        if not (
            callable(getattr(module, "model", None))
            and callable(getattr(module, "example_inputs", None))
        ):
            raise SystemExit(f"kiln tune: {spec!r} does not {USAGE_HINT}")
        try:
            model, inputs = module.model(), module.example_inputs()
        except Exception as exc:
            raise _model_error(spec, "calling model() and example_inputs() of", exc) from None
    return model, list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]


class ProgressBar:
    """`kiln tune`'s progress on stderr. Tuning makes two passes over a graph's kernels
    (time each one's heuristic config, then search each), shown as such, with the time left
    estimated from the fraction done. On a terminal the line is redrawn in place; otherwise
    (a log file, CI) each step is a line of its own, with no carriage returns."""

    def __init__(self, graphs: int, stream: Any = None, width: int = 24,
                 interactive: bool | None = None) -> None:
        self.graphs, self.stream, self.width = graphs, stream or sys.stderr, width
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty()) if interactive is None else interactive
        self.graph = 0
        self.started = time.monotonic()
        self._drawn = False

    def __call__(self, done: int, total: int, kernel: str) -> None:
        kernels = max(1, total // 2)
        phase, step = ("time heuristic", done) if done < kernels else ("search", done - kernels)
        frac = (self.graph + (done / total if total else 1.0)) / max(1, self.graphs)
        elapsed = time.monotonic() - self.started
        left = f"~{_duration(elapsed * (1 - frac) / frac)} left" if frac > 0 else "estimating"
        where = f"graph {self.graph + 1}/{self.graphs}"
        if done >= total:  # the tuner's last call: this graph is finished
            text = f"{where} done  {_duration(elapsed)} elapsed, {left}"
        else:
            text = (f"{where} {phase} kernel {step + 1}/{kernels}  {_duration(elapsed)} "
                    f"elapsed, {left}  {kernel[:40]}")
        if self.interactive:
            filled = int(frac * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r[{bar}] {text:<110}")
            self._drawn = True
        else:
            self.stream.write(f"kiln tune: {text}\n")
        self.stream.flush()

    def close(self) -> None:
        """End the redrawn line (nothing to end in line-per-step mode)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def kernel_rows(graph_label: str, result: Any, speed: bool = True) -> list[list[str]]:
    """Table rows (one per kernel) of one graph's tuning result; without `speed` (times
    from the Triton interpreter) no speedup column."""
    from tuner.report import fmt_ms, fmt_ratio, ratio

    rows = []
    for k in result.kernels:
        speedup = [fmt_ratio(ratio(k.heuristic_ms, k.tuned_ms))] if speed else []
        rows.append([graph_label, k.name, k.kind, fmt_ms(k.heuristic_ms), fmt_ms(k.tuned_ms),
                     *speedup, k.winner.label(), str(k.trials)])
    return rows


def graph_row(graph_label: str, result: Any, speed: bool = True) -> list[str]:
    """The totals row of one graph; without `speed` no eager time (real PyTorch beside
    interpreter times) and no speedup."""
    from tuner.report import fmt_ms, fmt_ratio, ratio

    timed = [fmt_ms(result.eager_ms)] if speed else []
    speedup = [fmt_ratio(ratio(result.heuristic_ms, result.best_ms))] if speed else []
    return [graph_label, *timed, fmt_ms(result.heuristic_ms), fmt_ms(result.best_ms), *speedup,
            str(result.trials), f"{result.seconds:.1f}"]


def tables(rows: list[list[str]], totals: list[list[str]], speed: bool) -> str:
    """The per-kernel table and the per-graph table, as printed."""
    from tuner.report import table

    unit = "ms" if speed else "interp. ms"
    speedup = ["speedup"] if speed else []
    kernel_headers = ["graph", "kernel", "kind", f"heuristic {unit}", f"tuned {unit}", *speedup,
                      "config", "trials"]
    graph_headers = ["graph", *(["eager ms"] if speed else []), f"heuristic {unit}",
                     f"tuned {unit}", *speedup, "trials", "seconds"]
    text = table(kernel_headers, rows) + "\n\n" + table(graph_headers, totals)
    if not speed:
        text += ("\n(cpu: Triton interpreter times check that every candidate runs and is "
                 "correct; they say nothing about speed, so no speedups are shown)")
    return text


def _device(value: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not cpu, cuda or cuda:N")
    return value


def check_device(device: str) -> None:
    """Refuse a CUDA device this process cannot use, in one line."""
    import torch

    if device == "cpu":
        return
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "a CUDA build"
        raise SystemExit(f"kiln tune: --device {device}: no CUDA device here (torch "
                         f"{torch.__version__} is {build}); use --device cpu")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise SystemExit(f"kiln tune: --device {device}: only {torch.cuda.device_count()} "
                         "CUDA device(s) visible")


INPUTS_HINT = " (check that example_inputs() fits the model)"


def _model_error(spec: str, step: str, exc: Exception, hint: str = INPUTS_HINT) -> SystemExit:
    """One line for an exception raised by the user's model code (a syntax error names
    the file and line: its own text is `invalid syntax (model.py, line 3)`)."""
    first = next((ln for ln in str(exc).splitlines() if ln.strip()), "").strip()
    return SystemExit(f"kiln tune: {step} {spec!r} failed: {type(exc).__name__}: {first}{hint}")


def check_output(path: str) -> None:
    """Refuse, in one line and before any tuning, a --json path that cannot be written:
    its results would be lost at the end of the tune."""
    out = Path(path)
    parent = out.parent
    if out.is_dir():
        problem = "is a directory"
    elif not parent.is_dir():
        problem = f"no such directory {str(parent)!r}"
    elif not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        problem = "not writable"
    else:
        return
    raise SystemExit(f"kiln tune: --json {path}: {problem}")


def _at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 1")
    return number


def _positive_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds > 0")
    return number


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kiln tune", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="model.py | pkg.module | pkg.module:factory (" + USAGE_HINT + ")")
    p.add_argument("--device", default=None, type=_device,
                   help="cuda[:N] or cpu (default: cuda if available)")
    p.add_argument("--train", action="store_true", help="tune the backward graph too")
    p.add_argument("--trials", type=_at_least_one, default=None,
                   help="trial budget per graph, >= 1 (default: 50, unbounded with --seconds)")
    p.add_argument("--seconds", type=_positive_seconds, default=None,
                   help="time budget per graph")
    p.add_argument("--strategy", default="auto", choices=STRATEGIES,
                   help="search strategy (default: auto, by the size of each kernel's space)")
    p.add_argument("--json", dest="json_out", default=None, help="write every result to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `kiln tune`; returns the process exit code."""
    args = parse_args(argv)
    if args.json_out:
        check_output(args.json_out)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import compiler
    from compiler.lowering.tracing import trace_inference, trace_training
    from tuner.api import tune
    from tuner.search import Budget

    model, inputs = load_model(args.model)
    if hasattr(model, "to"):
        model = model.to(device)
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    try:
        if args.train:
            fwd, bwd, fwd_in, bwd_in = trace_training(model, inputs)
            traced = [("forward", fwd, fwd_in), ("backward", bwd, bwd_in)]
        else:
            gm, ins = trace_inference(model, inputs)
            traced = [("forward", gm, ins)]
    except Exception as exc:  # the model's own code on its own inputs
        raise _model_error(args.model, "tracing", exc) from None
    target = compiler.Target.detect(device)
    trials = args.trials if args.trials is not None else (None if args.seconds else 50)
    budget = Budget(trials=trials, seconds=args.seconds)
    bar = ProgressBar(len(traced))
    speed = device != "cpu"
    rows, totals, dump = [], [], []
    for i, (label, gm, ins) in enumerate(traced):
        bar.graph = i
        graph = compiler.from_wire(compiler.to_wire(gm, ins))
        result = tune(graph, target, budget, device=device, strategy=args.strategy, progress=bar)
        rows += kernel_rows(label, result, speed)
        totals.append(graph_row(label, result, speed))
        dump.append({"graph": label, **result.to_json()})
    bar.close()
    print(tables(rows, totals, speed))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(dump, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
