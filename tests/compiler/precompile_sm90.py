"""`python -m tests.compiler.precompile_sm90 [--serial]`: `Built.precompile`'s path for an
sm_90 target on a machine without a GPU, with a stand-in CUDA driver (it names the current
device and its target; nothing launches). Prints one JSON line: launches, distinct sources,
compile jobs, kernels compiled by the workers, and the Triton cache files that the JIT's
own warmup wrote afterwards (0: every launch found its binary). Run with the interpreter
off, a private TRITON_CACHE_DIR and KILN_KERNEL_DIR (tests/compiler/test_compile_pool.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

import compiler
from compiler import aot
from tests.compiler.oputil import rand, trace

ROOT = Path(__file__).resolve().parents[2]


class StandInCuda:
    """What the JIT asks a CUDA driver before it compiles: device, stream, target."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)


def _layers(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Two identical linear-GELU layers and a softmax: three launches, two kernels."""
    y = F.gelu(F.gelu(x @ w1) @ w2)
    return y, torch.softmax(y, -1)


def build_for_sm90(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> tuple[Any, Any]:
    """(schedule, Built) of `gm` for an sm_90 target, every launch compiled by Triton's JIT
    for sm_90 through the stand-in driver (nothing launches). Run with the interpreter off."""
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    schedule = compiler.heuristic_schedule(gm, target, inputs)
    built = compiler.build(gm, schedule, inputs)
    driver.set_active(StandInCuda())
    for info in built.launches():
        info.fn.warmup(*info.arg_dtypes, grid=info.grid, **info.constexprs, **info.options)
    return schedule, built


def run_module(module: str, tmp_path: Path, *args: str, unset: tuple[str, ...] = (),
               timeout: float = 900, **env: str) -> list[str]:
    """`python -m module *args` with the interpreter off, Triton's cache and the kernel
    directory under `tmp_path`, `unset` variables removed and `env` set; its stdout lines
    (it must exit 0)."""
    child = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", *unset)}
    child.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), KILN_KERNEL_DIR=str(tmp_path / "kernels"),
                 **env)
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=child,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def _cache_files() -> int:
    return sum(len(files) for _, _, files in os.walk(knobs.cache.dir))


def main() -> None:
    serial = "--serial" in sys.argv
    gm = trace(_layers, rand((64, 128), seed=1), rand((128, 128), seed=2), rand((128, 128), seed=3))
    graph = compiler.from_wire(compiler.to_wire(gm, [rand((64, 128)), rand((128, 128)),
                                                     rand((128, 128))]))
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
    driver.set_active(StandInCuda())
    infos = built.launches()
    start = time.perf_counter()
    jobs = [] if serial else built._compile_jobs(infos)
    compiled = aot.compile_ahead(jobs)
    before = _cache_files()
    for info in infos:
        info.fn.warmup(*info.arg_dtypes, grid=info.grid, **info.constexprs, **info.options)
    print(json.dumps({"launches": len(infos), "sources": len({k.source_hash for k in built.kernels}),
                      "jobs": len(jobs), "compiled": compiled,
                      "warmup_cache_files": _cache_files() - before,
                      "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    main()
