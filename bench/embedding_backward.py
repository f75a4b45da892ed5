"""ATen's embedding backward against kiln's compact one (`compiler/runtime/library_calls.py`),
each replayed from a CUDA graph, at tables and token counts of real models:

    python -m bench.embedding_backward --out embedding_backward.json

Per (rows, width, tokens, dtype): the median GPU us per call of each (CUDA graph replays
of 20 calls, L2 left warm as in a training step, 5 rounds), their ratio, and the largest
difference between the two results relative to the largest gradient value. Token ids are
drawn as text has them (a few ids repeated hundreds of times, most rare). A GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from compiler.runtime.library_calls import compact_embedding_backward

# (table rows, width, tokens): GPT-2's vocabulary and positions at batch 8 x 512, a
# Llama-style vocabulary at 8 x 1024 and 4 x 4096, BERT's, a small table with many tokens.
SHAPES = ((50257, 768, 4096), (1024, 768, 4096), (32000, 4096, 8192), (128256, 4096, 16384),
          (30522, 768, 16384), (4096, 1024, 65536))
CALLS = 20


def _tokens(n: int, vocab: int, device: torch.device) -> torch.Tensor:
    ranks = torch.rand(n, device=device).pow(4) * vocab
    return ranks.long().clamp(max=vocab - 1)


def _graph_us(fn: Any) -> float:
    """Median GPU us per call of `fn` replayed from a CUDA graph of CALLS calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return statistics.median(times)


def measure(rows: int, width: int, tokens: int, dtype: torch.dtype) -> dict[str, Any]:
    device = torch.device("cuda")
    ids = _tokens(tokens, rows, device)
    grad = torch.randn(tokens, width, device=device, dtype=dtype)
    aten = torch.ops.aten.embedding_dense_backward
    want = aten(grad, ids, rows, -1, False)
    got = compact_embedding_backward(grad, ids, rows, -1)
    aten_us = _graph_us(lambda: aten(grad, ids, rows, -1, False))
    compact_us = _graph_us(lambda: compact_embedding_backward(grad, ids, rows, -1))
    return {"rows": rows, "width": width, "tokens": tokens, "dtype": str(dtype).split(".")[-1],
            "aten_us": round(aten_us, 1), "compact_us": round(compact_us, 1),
            "aten_over_compact": round(aten_us / compact_us, 3),
            "max_rel_difference": ((got.float() - want.float()).abs().max()
                                   / want.float().abs().max()).item()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the rows as JSON here too")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("a CUDA GPU is needed", file=sys.stderr)
        return 2
    results = [measure(r, w, t, dtype) for r, w, t in SHAPES for dtype in (torch.bfloat16,)]
    print(f"{'rows':>8}{'width':>7}{'tokens':>8}  {'ATen us':>9}{'compact us':>12}{'ratio':>8}")
    for r in results:
        print(f"{r['rows']:>8}{r['width']:>7}{r['tokens']:>8}  {r['aten_us']:>9}"
              f"{r['compact_us']:>12}{r['aten_over_compact']:>8}")
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                        "torch": torch.__version__, "results": results},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
