"""`kiln.report()`: what this process compiled, from where, and the time it took, in a few
readable lines (`kiln.stats()` keeps the flat counters for tools); `KILN_REPORT=1` prints
it to stderr at exit.

    kiln: 4 graphs compiled (0 left eager), 9.8 s of your threads' time
      schedules: 1 from the local cache, 2 from the service, 1 computed here
      now: 3 tuned, 1 heuristic (1 tuned schedule swapped in later)
      kernels: 14 generated, 10 compiled binaries fetched from the service
      plans: 1 used (AOTAutograd skipped), 1 sent to the service
      time: plan lookup 3 ms, AOTAutograd 3.1 s, service exchange 7.5 s, code generation 1.2 s, ...
      fallbacks: timeout 3, wait_timeout 1 (each cause was warned about once)

A schedule built twice (the cache's heuristic, then the service's tuned one) counts in
both places; "now" is where the graphs this process still holds stand. "time" lists the
timed steps, which nest (the search holds the build) and run on several threads at once;
"your threads' time" is the wall time the application's own threads spent in them.
"""

from __future__ import annotations

import atexit
import os
import sys

from kiln import degrade

# Timed steps in the order a graph meets them, with the names a reader knows.
STEPS: dict[str, str] = {
    "plan": "plan lookup",
    "aot": "AOTAutograd",
    "wire": "wire format",
    "lower": "lowering",
    "service": "service exchange",
    "resolve": "schedule search and build",
    "build": "code generation",
    "precompile": "kernel compile and load",
    "fetch_binaries": "binary fetch",
    "first_call": "first calls",
    "prepare": "one-time setup",
    "background": "background compiles",
}


def report() -> str:
    """A few lines on what kiln did in this process (see the module docstring)."""
    stats = degrade.stats()
    graphs, eager = int(stats["graphs"]), int(stats["eager"])
    if not graphs and not eager:
        return "kiln: no graph compiled"
    lines = [f"kiln: {_n(graphs, 'graph')} compiled ({eager} left eager), "
             f"{_seconds(_own_threads_seconds())} of your threads' time"]
    schedules = _parts((stats["schedules_cached"], "from the local cache"),
                       (stats["schedules_fetched"], "from the service"),
                       (stats["schedules_local"], "computed here"))
    lines.append(f"  schedules: {schedules or 'none built'}")
    now = _now()
    if now:
        swaps = int(stats["swaps"])
        later = f" ({_n(swaps, 'tuned schedule')} swapped in later)" if swaps else ""
        lines.append(f"  now: {now}{later}")
    kernels = _parts((stats.get("kernels", 0), "generated"),
                     (stats.get("binaries_fetched", 0),
                      "compiled binaries fetched from the service"))
    if kernels:
        lines.append(f"  kernels: {kernels}")
    plans = _parts((stats.get("plans_used", 0), "used (AOTAutograd skipped)"),
                   (stats.get("plans_now", 0), "run from the first step (AOTAutograd's runtime skipped)"),
                   (stats.get("plans_sent", 0), "sent to the service"))
    if plans:
        lines.append(f"  plans: {plans}")
    times = [f"{STEPS.get(step, step)} {_seconds(stats[f'seconds:{step}'])}"
             for step in [*STEPS, *sorted(k[8:] for k in stats if k.startswith("seconds:"))]
             if stats.get(f"seconds:{step}", 0) >= 0.0005]
    if times:
        lines.append(f"  time: {', '.join(dict.fromkeys(times))}")
    fallbacks = sorted((k.split(":", 1)[1], int(v)) for k, v in stats.items()
                       if k.startswith("fallback:") and v)
    if fallbacks:
        lines.append(f"  fallbacks: {', '.join(f'{c} {n}' for c, n in fallbacks)} "
                     "(each cause was warned about once)")
    return "\n".join(lines)


def _n(count: float, noun: str) -> str:
    return f"{int(count)} {noun}{'' if int(count) == 1 else 's'}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def _parts(*counts: tuple[float, str]) -> str:
    return ", ".join(f"{int(n)} {what}" for n, what in counts if n)


def _now() -> str:
    """The levels of the graphs this process still holds (none before the backend loads)."""
    sessions = sys.modules.get("kiln.session")
    if sessions is None:
        return ""
    levels: dict[str, int] = {}
    for graph in sessions.compiled_graphs():
        levels[graph.level] = levels.get(graph.level, 0) + 1
    return ", ".join(f"{levels[level]} {level}" for level in ("tuned", "heuristic", "eager")
                     if level in levels)


def _own_threads_seconds() -> float:
    """Wall time the timeline's steps on threads other than kiln's own covered (their
    union: nested steps count once)."""
    spans = sorted((s["start"], s["start"] + s["seconds"]) for s in degrade.timeline()
                   if not str(s["thread"]).startswith("kiln-"))
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _print_at_exit() -> None:
    if os.environ.get("KILN_REPORT", "").strip().lower() in ("1", "true", "yes", "on"):
        print(report(), file=sys.stderr)


atexit.register(_print_at_exit)
