"""Library call or Triton template for one matmul: chosen from measurements of the GPU
class (`matmul_table.MEASURED`, written by `python -m bench.matmul_table`).

A product takes the choice of the nearest measured shape (distance: the sum of the
log2 ratios of M (times the batch), N and K) with the same epilogue flag. A GPU class
without a table, or a product far from every measured shape, follows the rule those
measurements show on an H200 (`bench/results/matmul_table_h200.json`: cuBLAS at least as
fast as the template's heuristic config on 129 of 130 shapes, down to 256x384x384): the library from 2^26 FLOPs (67 M) up, the
template below, where a launch costs more than the product and the fused epilogue saves one.
"""

from __future__ import annotations

import math

from compiler.codegen.kinds.matmul_table import MEASURED

LIBRARY_FLOPS = 1 << 26  # the rule without a nearby measurement
# Farther than this (in summed log2 steps) a measured shape says nothing of a product.
NEAREST_RANGE = 3.0


def _logs(m: int, n: int, k: int) -> tuple[float, float, float]:
    return math.log2(max(1, m)), math.log2(max(1, n)), math.log2(max(1, k))


# Per GPU class and epilogue flag: each measured shape in log2 space, and its choice.
_POINTS = {(arch, epilogue): [(_logs(*row[:3]), row[4]) for row in rows if row[3] == epilogue]
           for arch, rows in MEASURED.items() for epilogue in (False, True)}


def library_wins(arch: str, batch: int, m: int, n: int, k: int, epilogue: bool) -> bool:
    """Whether a `batch` x (M x K) @ (K x N) product runs faster as the library call."""
    point = _logs(batch * m, n, k)
    best, best_distance = None, NEAREST_RANGE
    for logs, library in _POINTS.get((arch, epilogue), ()):
        distance = sum(abs(a - b) for a, b in zip(point, logs, strict=True))
        if distance <= best_distance:
            best, best_distance = library, distance
    if best is not None:
        return best
    return 2 * batch * m * n * k >= LIBRARY_FLOPS
