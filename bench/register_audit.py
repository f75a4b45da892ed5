"""Registers, spills and occupancy of every kernel of a model's training step, for a GPU
that is not here:

    python -m bench.register_audit --model gpt_block_train
    python -m bench.register_audit --model gpt2 --out audit.json     # needs transformers

The model of `bench.models` is made on the meta device (no weight is computed), its
training step traced with AOTAutograd through dynamo (kiln's decompositions and
partitioner), each graph scheduled by kiln's heuristic for `--arch` (sm_90 by default) and
built, and every Triton launch compiled for that GPU as the service's target compile does
(`compiler.aot.compile_for_target`). From Triton's own cubin (`cuobjdump
--dump-resource-usage`): registers a thread, local (spilled) bytes and shared memory; then
the warps an SM holds at once (an H100/H200 SM: 65536 registers, 64 warps, 32 blocks,
228 KiB of shared memory) and the programs the launch runs. Kernels that spill or that an
SM holds fewer than `--min-warps` warps of are flagged: a memory-bound kernel wants many
in flight. Prints one line per launch and a summary per graph; `--out` writes JSON.

No timing: it shows what a schedule asks of the GPU, not how fast it runs (that is
`bench.kernel_breakdown`'s, on a GPU). Run with TRITON_INTERPRET unset (the interpreter's
`triton.language` does not lower for a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SM_REGISTERS, SM_WARPS, SM_BLOCKS, SM_SHARED = 65536, 64, 32, 228 * 1024
_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def warps_per_sm(registers: int, warps: int, shared: int) -> int:
    """Warps of one kernel an SM holds at once, bound by registers, blocks and shared memory
    (registers are allocated per warp, in units of 256)."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    blocks = min(SM_BLOCKS, SM_REGISTERS // (per_warp * warps),
                 SM_SHARED // shared if shared else SM_BLOCKS, SM_WARPS // warps)
    return blocks * warps


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers, stack, shared and local bytes of the one function in `cubin`."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        done = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True,
                              text=True, check=True, timeout=60)
    finally:
        os.unlink(f.name)
    found = _USAGE.search(done.stdout)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {done.stdout[-300:]}")
    registers, stack, shared, local = (int(g) for g in found.groups())
    return {"registers": registers, "stack": stack, "static_shared": shared, "local": local}


def training_graphs(model: str, small: bool) -> list[tuple[str, Any, list[Any]]]:
    """(role, graph, inputs) of one training step of `model`, traced on the meta device."""
    import torch

    from bench.models import CaseStep, instantiate
    from compiler.lowering.tracing import trace_training

    case, module, inputs = instantiate(model, torch.device("meta"), small)
    fwd, bwd, fwd_in, bwd_in = trace_training(CaseStep(case, module), inputs, through_dynamo=True)
    return [("forward", fwd, fwd_in), ("backward", bwd, bwd_in)]


def audit(gm: Any, inputs: list[Any], arch: int) -> list[dict[str, Any]]:
    """One row per Triton launch of `gm` built from kiln's heuristic for an sm_`arch` GPU."""
    import compiler
    from compiler import aot

    target = compiler.Target.named(f"sm_{arch}", name=f"sm_{arch}")
    schedule = compiler.heuristic_schedule(gm, target, inputs)
    built = compiler.build(gm, schedule, inputs)
    choices = {k.name: k for k in schedule.kernels}
    grids = {info.kernel: info.grid for info in built.launches()}
    rows = []
    for spec in aot.launch_specs(built):
        compiled, _ = aot.compile_for_target(spec, arch)
        usage = resource_usage(compiled.asm["cubin"])
        warps = int(spec.options.get("num_warps", 4))
        shared = int(getattr(compiled.metadata, "shared", 0) or 0)
        choice = choices[spec.kernel]
        grid = grids.get(spec.kernel, ())
        rows.append({"kernel": spec.kernel, "kind": choice.kind, "variant": choice.variant,
                     "sizes": dict(choice.sizes), "config": dict(choice.config),
                     **usage, "shared": shared, "num_warps": warps,
                     "warps_per_sm": warps_per_sm(usage["registers"], warps, shared),
                     "programs": int(grid[0]) if grid else None})
    return rows


def _line(role: str, row: dict[str, Any], min_warps: int) -> str:
    config = " ".join(f"{k}={v}" for k, v in row["config"].items())
    flag = "  <- spills" if row["local"] else (
        "  <- few warps" if row["warps_per_sm"] < min_warps else "")
    return (f"{role:<9}{row['kernel'][:40]:<41}{row['variant'][:10]:<11}{config:<52}"
            f"{row['registers']:>5}{row['local']:>7}{row['warps_per_sm']:>6}"
            f"{row['programs'] or 0:>9}{flag}")


def main(argv: list[str] | None = None) -> int:
    from bench.models import MODELS, missing_package

    parser = argparse.ArgumentParser(prog="python -m bench.register_audit",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--small", action="store_true", help="the model's small size")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, 90: sm_90")
    parser.add_argument("--min-warps", type=int, default=16, help="flag kernels below this")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here too")
    args = parser.parse_args(argv)
    missing = missing_package(args.model)
    if missing:
        print(f"{args.model} needs the package {missing!r}", file=sys.stderr)
        return 2
    from triton import knobs

    if knobs.runtime.interpret:
        print("run with TRITON_INTERPRET unset: the interpreter's kernels do not lower for a GPU",
              file=sys.stderr)
        return 2
    result: dict[str, Any] = {"model": args.model, "small": args.small, "arch": args.arch,
                              "graphs": {}}
    print(f"{'graph':<9}{'kernel':<41}{'variant':<11}{'config':<52}{'regs':>5}{'spill':>7}"
          f"{'w/SM':>6}{'programs':>9}")
    for role, gm, inputs in training_graphs(args.model, args.small):
        rows = audit(gm, inputs, args.arch)
        for row in rows:
            print(_line(role, row, args.min_warps))
        summary = {"launches": len(rows),
                   "max_registers": max((r["registers"] for r in rows), default=0),
                   "spilling": sum(bool(r["local"]) for r in rows),
                   "few_warps": sum(r["warps_per_sm"] < args.min_warps for r in rows)}
        print(f"{role}: {summary}")
        result["graphs"][role] = {"summary": summary, "kernels": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
