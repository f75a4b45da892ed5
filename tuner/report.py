"""Tables for the CLI and the benchmark: plain fixed-width text, one row per kernel or case."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.4f}" if ms < 1 else f"{ms:.3f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den when both are known and positive."""
    if not num or not den or num <= 0 or den <= 0:
        return None
    return num / den


def geomean(values: Sequence[float | None]) -> float | None:
    """Geometric mean of the known values, or None when there are none."""
    known = [v for v in values if v is not None and v > 0]
    if not known:
        return None
    return math.exp(sum(math.log(v) for v in known) / len(known))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned first column, right-aligned others, columns sized to fit."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])
