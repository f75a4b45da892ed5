"""Time from process start to the first compiled training step (forward + backward).

Each case runs in a fresh Python process; the time is measured from just before the
process is spawned to the end of its first step (CUDA synchronised), so it includes the
interpreter, `import torch`, CUDA start-up, tracing and compiling:

- `eager`: no compile (the floor);
- `dynamo_eager` / `aot_eager`: torch.compile's own tracing with nothing compiled (dynamo
  alone; dynamo and AOTAutograd): what any backend pays before it compiles anything;
- `kiln_populate`: kiln with no service (`KILN_URL=off`), empty caches: computes the
  heuristic schedules and fills `KILN_CACHE_DIR` (not a case to compare, a set-up step);
- `kiln_hit`: a fresh client whose schedules are all in `KILN_CACHE_DIR`, Triton's and
  kiln's kernel caches warm (a restart on the same node);
- `kiln_hit_background`: `kiln_hit` with `KILN_BACKGROUND=1`: the first steps run eagerly
  while kiln compiles on another thread; `compiled_done_s` is the end of the first step on
  kiln's kernels;
- `kiln_hit_cold_triton`: same schedules, empty Triton and kiln kernel caches (a fresh
  machine that gets schedules but no binaries: Triton compiles every kernel);
- `inductor_cold` / `inductor_warm`: `torch.compile` default, empty then filled
  `TORCHINDUCTOR_CACHE_DIR` / `TRITON_CACHE_DIR`.

Python bytecode: every child gets `PYTHONPYCACHEPREFIX=<run dir>/pycache`, and each case
runs once untimed before the timed runs, so that imports read compiled bytecode as on any
normally installed node (`PYTHONDONTWRITEBYTECODE` is dropped for the children). Without
that, an environment that cannot keep bytecode (the H200 test machine's sets
PYTHONDONTWRITEBYTECODE) recompiles every imported module in every process, 5-10 s per
process there, which swamps what is measured.

    python examples/cold_start.py --out cold_start.json            # the kernel suite's gpt_block
    TRITON_INTERPRET=1 python examples/cold_start.py --device cpu --d 32 --heads 2 \\
        --batch 2 --seq 8 --dtype float32 --cases eager,kiln_populate,kiln_hit   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("eager", "dynamo_eager", "aot_eager", "kiln_populate", "kiln_hit",
         "kiln_hit_background", "kiln_hit_cold_triton", "inductor_cold", "inductor_warm")


def _child(args: argparse.Namespace) -> None:
    """One case in this (fresh) process; prints one JSON line."""
    sys.path.insert(0, str(ROOT))
    import torch

    torch_imported = time.time()

    from examples.models import Block

    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    block = Block(args.d, args.heads).to(device=args.device, dtype=dtype)
    x = torch.randn(args.batch, args.seq, args.d, device=args.device, dtype=dtype,
                    requires_grad=True)
    grad_out = torch.randn_like(x)
    model_ready = time.time()
    kiln_case = args.child.startswith("kiln")
    if args.child == "eager":
        fn = block
    elif kiln_case:
        import kiln.backend

        fn = torch.compile(block, backend=kiln.backend.remote_compile)
    elif args.child in ("dynamo_eager", "aot_eager"):
        fn = torch.compile(block, backend="eager" if args.child == "dynamo_eager" else "aot_eager")
    else:
        fn = torch.compile(block)

    def step() -> torch.Tensor:
        out = fn(x)
        out.backward(grad_out)
        sync()
        return out

    out = fn(x)
    sync()
    forward_done = time.time()
    out.backward(grad_out)
    sync()
    done = time.time()
    # Background compiles (KILN_BACKGROUND=1): training goes on eagerly until the compiled
    # graphs are in; the first step that starts after that runs on kiln's kernels.
    eager_steps = 0
    while kiln_case and not kiln.wait_compiled(0):
        step()
        eager_steps += 1
    if eager_steps:
        x.grad = None
        out = step()
    compiled_done = time.time()
    got_out, got_grad = out.detach().float().clone(), x.grad.detach().float().clone()

    # Steady state, for information: the median of a few more steps.
    steps = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        steps.append(time.perf_counter() - t0)
    x.grad = None

    # Correctness, outside the timed region: the compiled step again, eagerly.
    ref = block(x)
    ref.backward(grad_out)
    result = {
        "case": args.child, "done_at": done, "torch_imported_at": torch_imported,
        "model_ready_at": model_ready, "forward_done_at": forward_done,
        "compiled_done_at": compiled_done, "eager_steps": eager_steps,
        "step_ms": sorted(steps)[len(steps) // 2] * 1e3,
        "out_max_abs_diff": (got_out - ref.detach().float()).abs().max().item(),
        "grad_max_abs_diff": (got_grad - x.grad.float()).abs().max().item(),
    }
    if args.child != "eager":
        from torch._dynamo.utils import compile_times

        result["dynamo_compile_times"] = compile_times(repr="str", aggregate=True)
    if kiln_case:
        result["kiln_stats"] = kiln.stats()
    print("RESULT " + json.dumps(result), flush=True)


def _dirs(root: Path, pycache: Path) -> dict[str, Path]:
    """The cache directories one series of cases shares."""
    dirs = {name: root / name for name in ("kiln_cache", "kiln_kernels", "kiln_triton",
                                            "inductor", "inductor_triton")}
    root.mkdir(parents=True)
    return {**dirs, "root": root, "pycache": pycache}


def _run_case(case: str, args: argparse.Namespace, dirs: dict[str, Path]) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=str(dirs["pycache"]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    fresh = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=dirs["root"]))
    if case.startswith("kiln"):
        env.update(KILN_URL="off", KILN_CACHE_DIR=str(dirs["kiln_cache"]),
                   TORCHINDUCTOR_CACHE_DIR=str(fresh / "inductor"))
        if case == "kiln_hit_background":
            env["KILN_BACKGROUND"] = "1"
        if case == "kiln_hit_cold_triton":
            env.update(KILN_KERNEL_DIR=str(fresh / "kernels"), TRITON_CACHE_DIR=str(fresh / "triton"))
        else:
            env.update(KILN_KERNEL_DIR=str(dirs["kiln_kernels"]),
                       TRITON_CACHE_DIR=str(dirs["kiln_triton"]))
    elif case.startswith("inductor"):
        env.update(TORCHINDUCTOR_CACHE_DIR=str(dirs["inductor"]),
                   TRITON_CACHE_DIR=str(dirs["inductor_triton"]))
    profile = ["-m", "cProfile", "-o", str(args.profile / f"{case}.prof")] if args.profile else []
    cmd = [sys.executable, *profile, str(Path(__file__).resolve()), "--child", case,
           "--device", args.device, "--d", str(args.d), "--heads", str(args.heads),
           "--batch", str(args.batch), "--seq", str(args.seq), "--dtype", args.dtype]
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.time() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"case": case, "error": (proc.stderr or proc.stdout)[-2000:], "wall_s": wall}
    result = json.loads(lines[-1].removeprefix("RESULT "))
    for name in ("done", "torch_imported", "model_ready", "forward_done", "compiled_done"):
        result[f"{name}_s"] = result.pop(f"{name}_at") - start
    result["first_step_s"] = result.pop("done_s")
    result["process_wall_s"] = wall
    result["warnings"] = [ln for ln in proc.stderr.splitlines() if "kiln:" in ln][:10]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=CASES)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each timed case")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the untimed first run of each case (bytecode caches cold)")
    parser.add_argument("--profile", type=Path,
                        help="directory: run each case under cProfile, one <case>.prof each")
    args = parser.parse_args()
    if args.child:
        _child(args)
        return 0

    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="kiln-cold-start-"))
    cases = args.cases.split(",")
    if not args.no_warmup:  # untimed: fills the bytecode cache the timed runs share
        warm = _dirs(root / "warmup", root / "pycache")
        for case in dict.fromkeys(cases):
            outcome = _run_case(case, args, warm)
            print(f"warm-up {case}: {'error' if 'error' in outcome else 'ok'}", flush=True)
    dirs = _dirs(root / "timed", root / "pycache")
    results: list[dict] = []
    summary = {"shape": {"d": args.d, "heads": args.heads, "batch": args.batch,
                         "seq": args.seq, "dtype": args.dtype, "device": args.device},
               "warmup": not args.no_warmup, "results": results}
    for case in cases:
        repeats = 1 if case in ("kiln_populate", "inductor_cold") else args.repeats
        for _ in range(repeats):
            try:
                result = _run_case(case, args, dirs)
            except subprocess.TimeoutExpired:
                result = {"case": case, "error": f"timed out after {args.timeout}s"}
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "warnings"}), flush=True)
            if args.out:  # after every case: a run cut short still leaves its numbers
                args.out.write_text(json.dumps(summary, indent=1))
    print(f"{'case':<24}{'first step s':>14}{'compiled step s':>17}{'import torch s':>16}"
          f"{'step ms':>10}{'out diff':>12}{'grad diff':>12}")
    for r in results:
        if "error" in r:
            print(f"{r['case']:<24}{'ERROR':>14}")
            continue
        print(f"{r['case']:<24}{r['first_step_s']:>14.2f}{r['compiled_done_s']:>17.2f}"
              f"{r['torch_imported_s']:>16.2f}"
              f"{r['step_ms']:>10.3f}{r['out_max_abs_diff']:>12.3g}{r['grad_max_abs_diff']:>12.3g}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
