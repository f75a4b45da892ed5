"""Where a process's GIL time goes, every thread at once: py-spy attached to this process.

cProfile sees one thread and counts the time it waits for the GIL as time spent in whatever
it was running; with two threads compiling (a training step's forward and backward), its
figures say little. `py-spy record --gil` samples every thread's stack only while that
thread holds the GIL, so the samples of a window add up to the CPU time Python ran in it.

    with sampled(os.environ.get("BENCH_PY_SPY")) as found:   # path of a py-spy binary
        ...                                                  # the code to look at
    found["gil_samples"]   # per thread: samples, then the top frames inclusive and own

Used by bench/model_suite.py around the first step (`BENCH_PY_SPY=/path/to/py-spy`, e.g.
as a `--hit-variants` entry). Nothing here is shipped.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RATE_HZ = 500
TOP = 45
ATTACH_S = 0.5  # py-spy needs this long to attach before its first sample
_REPO = f"{Path(__file__).resolve().parent.parent}/"


@contextmanager
def sampled(py_spy: str | None) -> Iterator[dict[str, Any]]:
    """Sample this process's GIL-holding threads while the block runs (nothing when
    `py_spy` is empty); the summary lands in the dict under `gil_samples`."""
    found: dict[str, Any] = {}
    if not py_spy:
        yield found
        return
    fd, out = tempfile.mkstemp(prefix="gil-", suffix=".txt")
    os.close(fd)  # py-spy writes it
    spy = subprocess.Popen([py_spy, "record", "--gil", "--threads", "--rate", str(RATE_HZ),
                            "--format", "raw", "--output", out, "--pid", str(os.getpid())],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(ATTACH_S)
    try:
        yield found
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            _, err = spy.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
        try:
            with open(out) as f:
                found["gil_samples"] = summary(f.read().splitlines(), RATE_HZ)
        except OSError:
            found["gil_samples"] = f"py-spy wrote nothing: {err.decode(errors='replace')[-400:]}"
        finally:
            if os.path.exists(out):
                os.unlink(out)


def summary(lines: list[str], rate: int, top: int = TOP) -> str:
    """py-spy's raw lines (`thread (id);frame;...;frame count`, root first) as text: per
    thread its samples and seconds, then the `top` frames by samples that include them and
    by samples they are the innermost frame of."""
    per_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    own: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread, frames = frames[0], [_short(f) for f in frames[1:]]
        n = int(count)
        totals[thread] += n
        for frame in set(frames):
            per_thread[thread][frame] += n
        if frames:
            own[thread][frames[-1]] += n
    text = []
    for thread, n in totals.most_common():
        text.append(f"== {thread}: {n} samples, {n / rate:.3f} s holding the GIL")
        text.append("-- inclusive")
        text += [f"{c:6d} {c / rate:7.3f}s  {f}" for f, c in per_thread[thread].most_common(top)]
        text.append("-- own")
        text += [f"{c:6d} {c / rate:7.3f}s  {f}" for f, c in own[thread].most_common(top // 2)]
    return "\n".join(text)


def _short(frame: str) -> str:
    """`func (path/to/site-packages/pkg/mod.py:12)` -> `func (pkg/mod.py)`: lines apart,
    one entry per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", _REPO, "python3.12/", "python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})"
