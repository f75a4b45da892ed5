"""Where a training step's GPU time goes: the top kernels of a few steps of the kernel
suite's gpt_block (docs/benchmarks.md; forward + backward), eager or through kiln
(`KILN_URL=off`: heuristic builds).

    python3 examples/profile_step.py --backend kiln --out kiln_kernels.txt
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("eager", "kiln", "inductor"), default="kiln")
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cpu", action="store_true",
                        help="profile the host side instead (cProfile of the steps, by own time)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("KILN_URL", "off")
    os.environ.setdefault("KILN_CUDA_GRAPHS", "0")  # kernel by kernel, not graph replays
    import torch
    from torch.profiler import ProfilerActivity, profile

    from examples.models import Block

    torch.manual_seed(0)
    block = Block(args.d, args.heads).to("cuda", torch.bfloat16)
    x = torch.randn(args.batch, args.seq, args.d, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    grad = torch.randn_like(x)
    if args.backend == "kiln":
        import kiln

        fn = torch.compile(block, backend=kiln.remote_compile)
    elif args.backend == "inductor":
        fn = torch.compile(block)
    else:
        fn = block
    for _ in range(3):  # compile, CUDA graph capture, warm
        fn(x).backward(grad)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):  # unprofiled, for the record
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x).backward(grad)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    print(f"{args.backend}: median step {sorted(times)[len(times) // 2]:.3f} ms over 20 "
          f"(KILN_CUDA_GRAPHS={os.environ['KILN_CUDA_GRAPHS']})", flush=True)
    if args.cpu:
        import cProfile
        import io
        import pstats
        import time

        start = time.perf_counter()
        with cProfile.Profile() as cprof:
            for _ in range(args.steps):
                fn(x).backward(grad)
            torch.cuda.synchronize()
        stream = io.StringIO()
        print(f"{(time.perf_counter() - start) / args.steps * 1e3:.3f} ms per step (profiled)",
              file=stream)
        pstats.Stats(cprof, stream=stream).sort_stats("tottime").print_stats(args.top)
        table = stream.getvalue()
        print(table)
        if args.out:
            args.out.write_text(table)
        return 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            fn(x).backward(grad)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top,
                                      max_name_column_width=70)
    print(table)
    if args.out:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
