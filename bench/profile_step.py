"""Where a compiled step's time goes: host (Python) functions and device kernels.

    python -m bench.profile_step --model gpt_block_train --step train --path kiln_heuristic
    python -m bench.profile_step --model resnet18 --step train --path eager --top 25

After a warm-up, `--iters` steps run under cProfile (host: the functions with the most own
time, and the cumulative time of the step) and then under torch.profiler (device: the
kernels with the most GPU time, with their launch counts). Paths as in bench.model_suite:
eager, inductor, inductor_ro, kiln_heuristic (KILN_URL=off is the caller's to set). Prints plain text;
`--out FILE` also writes it there.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

from bench.measure import synchronizer
from bench.models import add_case_arguments, compiled, instantiate, step_fn


def _host_report(step, sync, iters: int, top: int) -> str:
    profiler = cProfile.Profile()
    sync()
    profiler.enable()
    for _ in range(iters):
        step()
    profiler.disable()
    sync()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def _device_report(step, sync, iters: int, top: int) -> str:
    if not torch.cuda.is_available():
        return "(no CUDA device: no kernel times)\n"
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        sync()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=top,
                                     max_name_column_width=70)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(parser)
    parser.add_argument("--path", default="kiln_heuristic",
                        choices=("eager", "inductor", "inductor_ro", "kiln_heuristic"))
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=12,
                        help="steps before profiling: compiles, CUDA graph captures, swaps")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sync = synchronizer(device)
    case, module, inputs = instantiate(args.model, device, args.small)
    step = step_fn(case, args.step, compiled(args.path, module), inputs)
    for _ in range(args.warmup):  # first step compiles; later ones settle (CUDA graphs, swaps)
        step()
    sync()
    header = f"# {args.model} {args.step} {args.path} on {device}, {args.iters} steps\n"
    report = (header + "## host (cProfile)\n" + _host_report(step, sync, args.iters, args.top)
              + "\n## device (torch.profiler)\n" + _device_report(step, sync, args.iters, args.top))
    if args.path.startswith("kiln"):
        import kiln

        report += f"\n## kiln.stats()\n{kiln.stats()}\n"
    sys.stdout.write(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
