"""Server-side plots for the dashboard: matplotlib figures rendered to inline SVG.

Every plot is readable without colour: series differ by marker, hatch pattern and a text
label, and failures carry their reason as text. The SVG is deterministic (fixed hash salt,
no date metadata) so the same data renders the same bytes.
"""

from __future__ import annotations

import functools
import io
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # never open a window; must precede any figure creation

from markupsafe import Markup  # noqa: E402
from matplotlib import dates as mdates  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: E402

# Text stays text in the SVG (searchable, accessible), `$` in a label is never mathtext.
_RC = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo", "--"]
# Colours from the colour-blind-safe Okabe-Ito palette; shape and hatch carry the meaning too.
_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
_SPEEDUP_TICKS = [0.001, 0.01, 0.1, 0.25, 0.5, 1, 2, 4, 10, 100, 1000]
_XML_HEADER = re.compile(r"^.*?(<svg\b)", re.S)


# rcParams are process-global and pages render in a thread pool: one plot at a time.
_RENDER_LOCK = threading.RLock()


def _serialized(fn: Callable[..., Markup]) -> Callable[..., Markup]:
    @functools.wraps(fn)
    def locked(*args: Any, **kwargs: Any) -> Markup:
        with _RENDER_LOCK:
            return fn(*args, **kwargs)
    return locked


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=96, layout="constrained")


def _svg(fig: Figure, title: str, salt: str) -> Markup:
    """Render `fig` as an inline <svg> element labelled `title` for screen readers."""
    buf = io.StringIO()
    with matplotlib.rc_context({**_RC, "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = _XML_HEADER.sub(r"\1", buf.getvalue(), count=1)
    # Clip-path ids must be unique per page: several plots are inlined into one document.
    text = re.sub(r'id="([^"]+)"', lambda m: f'id="{salt}-{m.group(1)}"', text)
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{salt}-{m.group(1)})", text)
    text = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{salt}-{m.group(1)}"', text)
    safe_title = Markup.escape(title)
    text = text.replace("<svg ", f'<svg role="img" aria-label="{safe_title}" ', 1)
    return Markup(text)  # noqa: S704 - matplotlib escapes every text it writes into the SVG


def _empty(title: str, message: str, salt: str) -> Markup:
    with matplotlib.rc_context(_RC):
        fig = _figure(5.0, 1.2)
        ax = fig.add_subplot()
        ax.axis("off")
        ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    return _svg(fig, f"{title}: {message}", salt)


def _as_time(value: Any) -> datetime:
    """Accept a datetime, an ISO-8601 string or epoch seconds (the series' `t`)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _hbar(
    labels: Sequence[str], values: Sequence[float], title: str, xlabel: str, salt: str
) -> Markup:
    with matplotlib.rc_context(_RC):
        fig = _figure(5.0, 0.5 + 0.35 * max(len(labels), 1))
        ax = fig.add_subplot()
        ys = range(len(labels))
        bars = ax.barh(ys, values, color="white", edgecolor="black")
        for i, bar in enumerate(bars):
            bar.set_hatch(_HATCHES[i % len(_HATCHES)])
            bar.set_facecolor(_COLOURS[i % len(_COLOURS)] + "55")
        ax.set_yticks(list(ys), labels)
        ax.invert_yaxis()
        ax.bar_label(bars, labels=[f"{v:g}" for v in values], padding=3)
        ax.set_xlabel(xlabel)
        ax.set_xlim(0, max([*values, 1]) * 1.2)
    return _svg(fig, title, salt)


@_serialized
def counts_plot(counts: Mapping[str, int], title: str, salt: str, xlabel: str = "count") -> Markup:
    """Horizontal bars, one per key, each with its own hatch and its count written beside it."""
    if not counts:
        return _empty(title, "nothing recorded yet", salt)
    return _hbar(list(counts), [float(v) for v in counts.values()], title, xlabel, salt)


@_serialized
def hit_rate_plot(series: Sequence[Mapping[str, Any]], salt: str = "hitrate") -> Markup:
    """Hit rate (%) per time bucket as a line with round markers; lookups as labelled bars."""
    title = "Cache hit rate over time"
    points = [(_as_time(p["t"]), int(p["hits"]), int(p["misses"])) for p in series]
    if not points:
        return _empty(title, "no lookups yet", salt)
    times = [t for t, _, _ in points]
    rates = [100.0 * h / (h + m) if h + m else 0.0 for _, h, m in points]
    with matplotlib.rc_context(_RC):
        fig = _figure(6.0, 2.6)
        ax = fig.add_subplot()
        lookups = ax.twinx()
        # The rate line is drawn over the lookup bars of the twin axes.
        ax.set_zorder(lookups.get_zorder() + 1)
        ax.patch.set_visible(False)
        width = _bucket_width(times)
        lookups.bar(times, [h + m for _, h, m in points], width=width,
                    color="none", edgecolor="grey", hatch="//", label="lookups (right axis)")
        lookups.set_ylabel("lookups")
        lookups.spines["top"].set_visible(False)
        ax.plot(times, rates, marker="o", color=_COLOURS[0], label="hit rate % (left axis)")
        ax.set_ylim(0, 105)
        ax.set_ylabel("hit rate %")
        if len(times) == 1:  # one bucket: show the minutes around it, not a day-wide bar
            ax.set_xlim(mdates.date2num(times[0]) - 5 * width, mdates.date2num(times[0]) + 5 * width)
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        handles = ax.get_legend_handles_labels()[0] + lookups.get_legend_handles_labels()[0]
        ax.legend(handles, [h.get_label() for h in handles], loc="lower left",
                  bbox_to_anchor=(0, 1.0), ncols=2, frameon=False, fontsize=8)
    return _svg(fig, title, salt)


def _bucket_width(times: Sequence[datetime]) -> float:
    """Bar width in days (matplotlib's date unit): 80% of the smallest gap between buckets,
    or of a minute (the stats bucket) when there is a single one."""
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False) if b > a]
    return 0.8 * (min(gaps) if gaps else 60.0) / 86400.0


@_serialized
def speedup_plot(speedups: Iterable[float], salt: str = "speedups") -> Markup:
    """Histogram of tuned entries' speedups over eager, with the 1x line marked."""
    title = "Speedup of tuned schedules over eager"
    values = [float(s) for s in speedups if s is not None]
    if not values:
        return _empty(title, "no tuned entries yet", salt)
    # Log-spaced bins on a log axis: 0.5x and 2x sit symmetrically around the 1x line.
    low, high = min([*values, 0.5]) / 1.25, max([*values, 2.0]) * 1.25
    bins = [low * (high / low) ** (i / 16) for i in range(17)]
    with matplotlib.rc_context(_RC):
        fig = _figure(5.0, 2.2)
        ax = fig.add_subplot()
        ax.hist(values, bins=bins, color=_COLOURS[2] + "55", edgecolor="black", hatch="..")
        ax.set_xscale("log")
        # Plain "0.5x" tick labels (log axes default to mathtext, which is off here).
        ticks = [t for t in _SPEEDUP_TICKS if low <= t <= high]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.axvline(1.0, linestyle="--", color="black")
        ax.text(1.0, 1.0, " 1x", transform=ax.get_xaxis_transform(), va="top")
        ax.set_xlabel("speedup over eager (x, log scale, higher is better)")
        ax.set_ylabel("entries")
        ax.yaxis.get_major_locator().set_params(integer=True)
    return _svg(fig, title, salt)


@_serialized
def timings_plot(eager_ms: float | None, heuristic_ms: float | None, tuned_ms: float | None,
                 salt: str = "timings") -> Markup:
    """Eager, heuristic and tuned time of one entry as hatched, labelled bars."""
    title = "Eager vs heuristic vs tuned time"
    named = [("eager", eager_ms), ("heuristic", heuristic_ms), ("tuned", tuned_ms)]
    present = [(n, v) for n, v in named if v is not None]
    if not present:
        return _empty(title, "not measured yet", salt)
    return _hbar([n for n, _ in present], [float(v) for _, v in present], title, "ms", salt)


def config_label(config: Mapping[str, Any] | None, variant: str | None = None) -> str:
    """A short, stable text for a config: `persistent X1 R4096 w8 s1`."""
    short = {"XBLOCK": "X", "RBLOCK": "R", "BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K",
             "GROUP_M": "G", "num_warps": "w", "num_stages": "s"}
    parts = [f"{short.get(k, k)}{v}" for k, v in sorted((config or {}).items())]
    return " ".join(([variant] if variant else []) + parts)


@_serialized
def candidate_plot(kernel: str, measurements: Sequence[Mapping[str, Any]],
                   chosen: Mapping[str, Any] | None, salt: str,
                   chosen_variant: str | None = None) -> Markup:
    """Every measured candidate of one kernel: time per config, failures marked and labelled.

    Verified candidates are circles, candidates that ran but gave wrong results are
    triangles, failures are crosses drawn above the slowest time with their reason as text,
    and the chosen config is a star labelled "chosen".
    """
    title = f"Candidates measured for {kernel}"
    rows = list(measurements)
    if not rows:
        return _empty(title, "no candidates measured", salt)
    timed = [r["ms"] for r in rows if r.get("ms") is not None and not r.get("error")]
    failures = len(rows) - len(timed)
    top = max(timed) if timed else 1.0
    fail_y = top * 1.25
    chosen_label = config_label(chosen) if chosen is not None else None
    with matplotlib.rc_context(_RC):
        fig = _figure(6.5, 2.8)
        ax = fig.add_subplot()
        seen: set[str] = set()
        reasons_shown: set[str] = set()

        def mark(x: float, y: float, style: dict[str, Any], label: str) -> None:
            ax.scatter([x], [y], label=None if label in seen else label, **style)
            seen.add(label)

        for i, row in enumerate(rows):
            ms, error = row.get("ms"), row.get("error")
            if ms is None or error:
                mark(i, fail_y, {"marker": "x", "color": _COLOURS[5], "s": 40}, "failed")
                reason = _short(error or "no time")
                if reason not in reasons_shown:  # each reason once; the table lists them all
                    reasons_shown.add(reason)
                    ax.annotate(reason, (i, fail_y), rotation=60, fontsize=7,
                                xytext=(2, 4), textcoords="offset points")
            elif not row.get("verified", True):
                mark(i, ms, {"marker": "^", "color": _COLOURS[1], "s": 36}, "wrong result")
            else:
                mark(i, ms, {"marker": "o", "facecolors": "none", "edgecolors": _COLOURS[0],
                             "s": 30}, "verified")
            if chosen_label is not None and config_label(row.get("config")) == chosen_label \
                    and row.get("variant") in (None, chosen_variant or row.get("variant")) \
                    and ms is not None and not error:
                mark(i, ms, {"marker": "*", "color": "black", "s": 140, "zorder": 3}, "chosen")
                ax.annotate("chosen", (i, ms), xytext=(6, -10), textcoords="offset points")
        if not timed:
            ax.set_yticks([])
        ax.set_ylim(0, fail_y * 1.45 if failures else top * 1.15)
        ax.set_ylabel("ms (lower is better)")
        ax.set_xlabel("candidate # (configs listed in the table below)")
        if len(rows) <= 40:  # beyond that, matplotlib's own spacing keeps ticks legible
            ax.set_xticks(range(len(rows)))
        if len(rows) > 24:
            ax.tick_params(axis="x", labelsize=6)
        if timed and failures:  # separates timed candidates from the failures drawn above
            ax.axhline(fail_y * 0.92, color="grey", linewidth=0.5, linestyle=":")
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=4, frameon=False, fontsize=8)
    return _svg(fig, title, salt)


def _short(text: str, limit: int = 28) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
