"""Background poller: swaps tuned schedules into running graphs when the service has them.

One daemon thread per process watches every graph that is not tuned yet. It submits the
graph if the service never saw it (down at start, or invalidated), polls its schedule with
a growing interval, builds the tuned schedule off the training thread and installs it
(`CompiledGraph.install`, between calls). A graph leaves the watch list when it is tuned,
when its job is over with nothing better, or after `Config.poll_for` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from kiln.client import ServiceError
from kiln.compiled import CompiledGraph
from kiln.resolve import PollState, Resolver

log = logging.getLogger("kiln")

MAX_INTERVAL = 10.0  # seconds: the slowest a pending graph is polled


@dataclass
class _Watch:
    entry: CompiledGraph
    resolver: Resolver
    state: PollState
    give_up_at: float
    interval: float
    next_at: float = field(default=0.0)


class Poller:
    """The background thread; `watch()` adds a graph, `stop()` ends the thread."""

    def __init__(self) -> None:
        self._watches: list[_Watch] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def watch(self, entry: CompiledGraph, resolver: Resolver, submitted: bool,
              job_id: str | None) -> None:
        """Poll for `entry`'s tuned schedule in the background."""
        if resolver.client is None or entry.level == "tuned":
            return
        now = time.monotonic()
        interval = max(resolver.config.poll_interval, 0.05)
        with self._cond:
            if self._stopped:
                return
            self._watches.append(_Watch(entry, resolver, PollState(submitted, job_id),
                                        give_up_at=now + resolver.config.poll_for,
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
                    done = self._step(w)
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

    def _step(self, w: _Watch) -> bool:
        """One poll of one graph; True when it needs no more polling."""
        r, entry = w.resolver, w.entry
        assert r.client is not None
        try:
            answer = r.poll(entry, w.state)
            if answer.status == "unknown":  # never seen, or invalidated: submit next round
                return False
            if answer.status == "failed":
                return True
            if answer.status == "tuned" and answer.schedule is not None:
                r.build_from(entry, answer.schedule, "tuned", "service")
                return True  # a tuned schedule that cannot be built will not improve
            if answer.status == "heuristic" and answer.schedule is not None \
                    and entry.level == "eager":
                r.build_from(entry, answer.schedule, "heuristic", "service")
            last = r.settled(entry, w.state, answer)
            if last is None:
                return False
            if last.status == "tuned" and last.schedule is not None:
                r.build_from(entry, last.schedule, "tuned", "service")
            return True
        except ServiceError as exc:
            r.failed(exc)
            return False
