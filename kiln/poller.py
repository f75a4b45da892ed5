"""Background poller: the thread that swaps tuned schedules into running graphs.

One daemon thread per session (`kiln.session`) watches every graph its resolver settled
before it was tuned. It runs each graph's polling rounds (`Resolver.poll_round`: submit
if the service never saw it, read its schedule, build and install a tuned one off the
training thread) with a growing interval. A graph leaves the watch list when a round says
it needs no more, or after `Config.poll_for` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.compiled import CompiledGraph
from kiln.resolve import PollState

log = logging.getLogger("kiln")

MAX_INTERVAL = 10.0  # seconds: the slowest a pending graph is polled


@dataclass
class _Watch:
    entry: CompiledGraph
    state: PollState
    poll_round: Callable[[CompiledGraph, PollState], bool]
    give_up_at: float
    interval: float
    next_at: float = field(default=0.0)


class Poller:
    """The background thread (started by the first `watch()`); `stop()` ends it."""

    def __init__(self, interval: float, give_up_after: float) -> None:
        self._first_interval = max(interval, 0.05)
        self._give_up_after = give_up_after
        self._watches: list[_Watch] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def watch(self, entry: CompiledGraph, state: PollState,
              poll_round: Callable[[CompiledGraph, PollState], bool]) -> None:
        """Run `poll_round(entry, state)` in the background until it returns True (or the
        poller gives up on the graph)."""
        if entry.level == "tuned":
            return
        now = time.monotonic()
        interval = self._first_interval
        with self._cond:
            if self._stopped:
                return
            self._watches.append(_Watch(entry, state, poll_round,
                                        give_up_at=now + self._give_up_after,
                                        interval=interval, next_at=now + interval))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kiln-poller",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self) -> int:
        """How many graphs are still watched."""
        with self._cond:
            return len(self._watches)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling and wait (up to `timeout`) for the thread to end."""
        with self._cond:
            self._stopped = True
            self._watches.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._due():
                    wait = min((w.next_at for w in self._watches), default=None)
                    self._cond.wait(None if wait is None else max(0.0, wait - time.monotonic()))
                if self._stopped:
                    return
                due = [w for w in self._watches if w.next_at <= time.monotonic()]
            for w in due:
                try:
                    done = w.poll_round(w.entry, w.state)
                except Exception:  # the poller must never die
                    log.exception("kiln poller: unexpected error; dropping graph %s",
                                  w.entry.key[:12] if w.entry.key else "?")
                    done = True
                now = time.monotonic()
                with self._cond:
                    if done or now >= w.give_up_at:
                        if w in self._watches:
                            self._watches.remove(w)
                    else:
                        w.interval = min(w.interval * 1.5, MAX_INTERVAL)
                        w.next_at = now + w.interval

    def _due(self) -> bool:
        now = time.monotonic()
        return any(w.next_at <= now for w in self._watches)
