"""Degrade, never break: one warning per cause, and the process-wide counters.

A training step calls compiled graphs thousands of times; a service that is down must cost
one line in the log, not one per call. Each cause is warned about once per process (until
`reset()`), through `warnings` only (category `KilnWarning`): logging it as well printed
every warning twice. `logging.captureWarnings(True)` routes it into an application's logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator

log = logging.getLogger("kiln")

# Why the backend fell back, with the sentence a user reads. Keys are stable: tests and
# dashboards match them.
CAUSES: dict[str, str] = {
    "unreachable": "the kiln service at {url} cannot be reached",
    "timeout": "the kiln service at {url} did not answer in time",
    "server_error": "the kiln service at {url} answered with a server error",
    "malformed": "the kiln service at {url} sent an answer kiln cannot use",
    "auth": "the kiln service at {url} refused the token (set KILN_TOKEN)",
    "rejected": "the kiln service refused a graph",
    "hash_mismatch": "a schedule from the service does not match the kernels this client "
                     "generates (different kiln/triton version?)",
    "bad_schedule": "a schedule from the service cannot be built here",
    "wait_timeout": "a tuned schedule did not arrive within the wait timeout",
    "unsupported": "kiln cannot compile a graph (unsupported op or input)",
    "build_failed": "kiln's local build of a graph failed",
    "dynamic_shapes": "a graph has symbolic (dynamic) sizes",
    "cpu_eager": "kiln runs CPU graphs only on Triton's interpreter (TRITON_INTERPRET=1, for "
                 "tests), which is not on in this process",
    "cache": "the local schedule cache cannot be written",
    "config": "the kiln configuration is not valid",
    "binary_refused": "a compiled kernel from the service failed its checks (sha256, source "
                      "hash or files)",
    "binary_load": "a compiled kernel from the service did not load",
    "plan": "kiln could not keep the plan of a graph (what AOTAutograd made of it)",
}

_ACTIONS: dict[str, str] = {
    "unreachable": "using local heuristic builds; tuned schedules are swapped in if it comes back",
    "timeout": "using local heuristic builds",
    "server_error": "using local heuristic builds",
    "malformed": "using local heuristic builds",
    "auth": "using local heuristic builds",
    "rejected": "running it locally",
    "hash_mismatch": "building from the local heuristic schedule instead",
    "bad_schedule": "building from the local heuristic schedule instead",
    "wait_timeout": "starting with the best schedule at hand; the tuned one is swapped in when "
                    "it lands",
    "unsupported": "running it eagerly (plain PyTorch)",
    "build_failed": "running it eagerly (plain PyTorch)",
    "dynamic_shapes": "compiling one graph per concrete shape (see docs/client.md)",
    "cpu_eager": "running CPU graphs eagerly (plain PyTorch, faster than the interpreter)",
    "cache": "continuing without it",
    "config": "running graphs eagerly (plain PyTorch) until it is fixed",
    "binary_refused": "compiling it here instead",
    "binary_load": "compiling the graph's kernels here instead",
    "plan": "its next compile goes through AOTAutograd again",
}


class KilnWarning(RuntimeWarning):
    """Emitted once per cause when kiln falls back to a slower path."""


_lock = threading.Lock()
_warned: set[str] = set()
_counts: Counter[str] = Counter()
_seconds: Counter[str] = Counter()
# Each timed step as it happened (`timeline`): where a first step's time goes, per thread.
_START = time.perf_counter()  # the timeline's zero: when kiln was imported
# (step, thread, start s, seconds, CPU seconds or None)
_timeline: list[tuple[str, str, float, float, float | None]] = []
TIMELINE_MAX = 2000  # steps kept; a long job's later ones are dropped


def warn_once(cause: str, detail: str = "", action: str | None = None, **fmt: str) -> bool:
    """Warn about `cause` (a key of `CAUSES`) unless this process already did; `action`
    says what kiln does instead where that is not the cause's usual fallback.

    Every call is counted (`stats()["fallbacks"]`); only the first per cause warns.
    Returns whether a warning was emitted.
    """
    with _lock:
        _counts[f"fallback:{cause}"] += 1
        if cause in _warned:
            log.debug("kiln fallback (%s): %s", cause, detail)
            return False
        _warned.add(cause)
    what = CAUSES.get(cause, cause).format(url=fmt.get("url", "?"))
    message = f"kiln [{cause}]: {what}; {action or _ACTIONS.get(cause, 'falling back')}."
    if detail:
        message += f" ({detail})"
    _warn_at_user_code(message)
    return True


def _internal_roots() -> tuple[str, ...]:
    """Folders whose frames a warning skips: kiln's packages, torch and triton (dynamo's
    frames between the user's call and kiln's), and the standard library (threads)."""
    import sysconfig

    roots = [sysconfig.get_paths()["stdlib"]]
    for name in ("kiln", "compiler", "tuner", "torch", "triton"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            roots.append(os.path.dirname(os.path.abspath(module.__file__)))
    return tuple(os.path.join(root, "") for root in roots)


def _warn_at_user_code(message: str) -> None:
    """Warn with the location of the innermost frame of the user's code (the line that
    called the compiled model), not kiln's own source; on kiln's own threads there is
    none, and the warning names `kiln` with no source line under it."""
    roots = _internal_roots()
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(roots):
        frame = frame.f_back
    if frame is None:
        warnings.warn_explicit(message, KilnWarning, "kiln", 0, module="kiln")
        return
    where = (frame.f_code.co_filename, frame.f_lineno)
    module = frame.f_globals.get("__name__", "__main__")
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    try:
        warnings.warn_explicit(message, KilnWarning, *where, module=module, registry=registry,
                               module_globals=frame.f_globals)
    except ImportError:  # code with no source to show (a script read from stdin)
        warnings.warn_explicit(message, KilnWarning, *where, module=module, registry=registry)


def count(name: str, n: int = 1) -> None:
    """Add `n` to the process-wide counter `name`."""
    with _lock:
        _counts[name] += n


def add_seconds(name: str, seconds: float, cpu_seconds: float | None = None) -> None:
    """Add to the process-wide time counter `seconds:<name>` (where compile time goes), and
    put the step that just ended on the timeline (with the CPU time its thread spent in it,
    when known: less than `seconds` where it waited for the GIL, the device or the network)."""
    start = clock() - seconds
    thread = threading.current_thread().name
    with _lock:
        _seconds[name] += seconds
        if len(_timeline) < TIMELINE_MAX:
            _timeline.append((name, thread, start, seconds, cpu_seconds))


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    """Time the block as the step `name` (`add_seconds`), its thread's CPU time included,
    whether it returns or raises."""
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        add_seconds(name, time.perf_counter() - start, time.thread_time() - cpu)


def clock() -> float:
    """Seconds since kiln was imported: the timeline's clock."""
    return time.perf_counter() - _START


def timeline() -> list[dict[str, object]]:
    """The timed compile steps of `stats()["seconds:<step>"]` one by one, in the order they
    ended: `step`, `thread` (the training thread is `MainThread`; `kiln-backward-ahead`,
    `kiln-prepare`, `kiln-compile` and `kiln-poller` are kiln's), `start` (`clock()` when
    it began), `seconds` and, for steps timed with `timed`, `cpu_seconds` (the thread's CPU
    time: the rest it waited). Steps nest (`resolve` holds `build` and `precompile`) and
    threads overlap, so where their seconds add up to more than a first step took, the
    threads were waiting for each other (the GIL) or for the service."""
    with _lock:
        return [{"step": n, "thread": t, "start": round(s, 4), "seconds": round(d, 4),
                 **({} if c is None else {"cpu_seconds": round(c, 4)})}
                for n, t, s, d, c in _timeline]


def stats() -> dict[str, float]:
    """Process-wide counters.

    - `schedules_local`: heuristic schedules this process computed itself
    - `schedules_fetched`: schedules that came from the service
    - `schedules_probed`: graphs the service answered from a lookup alone (their job done, no
      graph sent); a schedule already built from the disk cache is not fetched again
    - `schedules_cached`: schedules read from the local disk cache
    - `builds`: graphs built into Triton kernels; `kernels`: the kernels those builds
      generated; `eager`: graphs run eagerly
    - `swaps`: tuned schedules swapped in after the first call
    - `fallback:<cause>`: how often each degrade cause happened
    - `seconds:<step>`: time spent per compile step: `aot` (AOTAutograd's trace of a
      dynamo graph, with its forward or inference graph's compile in it), `wire` (convert
      and key), `resolve` (cache, service, build), `build` (code generation), `precompile`
      (Triton compiles and loads the kernels), `service` (a wait-mode graph's exchange with
      the service, on a thread of its own while the graph lowers: `lower`), `prepare` (once per process: compile workers
      and Triton's loader, on a thread of its own), `background` (all of that, for graphs
      resolved off the training thread); `timeline()` lists the steps one by one
    """
    with _lock:
        result: dict[str, float] = {k: 0 for k in ("schedules_local", "schedules_fetched",
                                                   "schedules_cached", "builds", "eager",
                                                   "swaps", "graphs")}
        result.update(_counts)
        result.update({f"seconds:{k}": round(v, 4) for k, v in _seconds.items()})
        return result


def warned() -> set[str]:
    """Causes this process has warned about."""
    with _lock:
        return set(_warned)


def reset() -> None:
    """Forget counters and warned causes (tests; a long-lived process after a fix)."""
    with _lock:
        _warned.clear()
        _counts.clear()
        _timeline.clear()
        _seconds.clear()
