"""`python -m tests.compiler.host_path_bench [--scale full] [--cases gpt_block_train]`: host
time of one call of each aten graph of the kernel suite's cases (training: forward and
backward), per way of running it (issue 13's host path):

- `steps`: the step-by-step loop (`Built._run`, what every call ran before the launcher),
  kernels through Triton's JIT;
- `jit`: the generated launcher, kernels through Triton's JIT;
- `direct`: the generated launcher, kernels through their compiled kernels' launchers;
- `graph`: CUDA graph replay (`Built.__call__` with KILN_CUDA_GRAPHS on).

On CUDA it times real launches: host µs per call (until the call returns; calls back to
back, one synchronize per block) and GPU ms per call. With `--stub` (any device; the CPU by
default) kernels are replaced by no-ops, so only the Python around them is timed.
Prints one JSON line per graph.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

import compiler
from compiler.runtime import cudagraphs


class _NoKernel:
    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


WAYS = ("steps", "jit", "direct", "graph")


def _caller(way: str, built: compiler.Built, xs: list[Any]) -> Callable[[], Any]:
    if way == "steps":
        return lambda: built._run(xs, None)
    if way == "graph":
        return lambda: built(*xs)
    return lambda: built._launcher(xs, False)


def _time(fn: Callable[[], Any], sync: Callable[[], None], n: int) -> tuple[float, float]:
    """(host µs per call, wall ms per call including the GPU): best of 5 blocks of n."""
    for _ in range(3):
        fn()
    sync()
    host, wall = [], []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        issued = time.perf_counter()
        sync()
        done = time.perf_counter()
        host.append((issued - start) / n * 1e6)
        wall.append((done - start) / n * 1e3)
    return min(host), min(wall)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", default="full")
    parser.add_argument("--cases", default="gpt_block_train")
    parser.add_argument("--stub", action="store_true", help="no-op kernels (Python only)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-n", type=int, default=50)
    args = parser.parse_args()
    from bench.cases import traced_graphs

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    wanted = set(args.cases.split(","))
    target = compiler.Target.detect(str(device)) if cuda else compiler.Target.named(
        "sm_90", name="NVIDIA H200")
    for name, gm, inputs in traced_graphs(args.scale):
        if name.split(".")[0] not in wanted:
            continue
        graph = compiler.from_wire(compiler.to_wire(gm, inputs))
        xs = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).copy_(t)
              if isinstance(t, torch.Tensor) else t for t in inputs]
        row: dict[str, Any] = {"graph": name, "device": str(device), "stub": args.stub}
        for way in WAYS:
            if way == "graph" and (not cuda or args.stub):
                continue
            built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
            if args.stub:
                for launch in built._launches():
                    launch.kernel_for = lambda device, _k=_NoKernel(): _k  # type: ignore[method-assign]
            else:
                built.precompile(device)
            launcher = built._launcher
            if way == "jit":  # keep the JIT: the device's launcher is its "jit" function
                launcher._fns[device] = launcher.compile(device, "jit")
            if way != "graph":
                built._graphs = cudagraphs.GraphRunner(lambda _: None, 1)
                built._graphs.failed = True
            host, wall = _time(_caller(way, built, xs), sync, args.n)
            row[f"{way}_host_us"] = round(host, 1)
            if cuda and not args.stub:
                row[f"{way}_wall_ms"] = round(wall, 3)
            if way == "direct":
                row["direct_mode"] = launcher.modes.get(device)
            if way == "graph":
                runner = built._graphs
                row["graph_replays"] = runner.replays if runner else 0
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
