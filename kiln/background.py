"""Compiling off the training thread (`KILN_BACKGROUND=1`).

With it, each aten graph AOTAutograd hands to kiln runs eagerly (the aten graph itself)
from its first call, while one daemon thread (its configuration's, `kiln.session`) does
kiln's part of the work: converting and keying the graph, finding its schedule (cache,
service, local heuristic), generating the kernels and loading them onto the GPU. The build is then installed between two calls
(`CompiledGraph.install`). The first step of a job costs eager plus torch.compile's own
tracing (dynamo and AOTAutograd, which must stay on the calling thread: their tracers patch
`torch.nn.Module` for the whole process while they run); kiln's kernels take over a few
steps later.

Graphs are handled one at a time, in the order they were handed over.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from kiln import degrade

log = logging.getLogger("kiln")


class Compiler:
    """The one background thread and its queue of jobs."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], Any]) -> None:
        """Run `job()` on the background thread; it installs what it builds itself, and
        whatever it raises is warned once (the graph stays as it is)."""
        with self._lock:
            self._pending += 1
            if self._thread is None or not self._thread.is_alive():  # first use, or a fork
                self._thread = threading.Thread(target=self._run, name="kiln-compile",
                                                daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every job handed over has finished; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stop(self) -> None:
        """End the thread after the jobs already queued."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                with degrade.timed("background"):
                    job()
            except Exception as exc:  # the thread must never die
                degrade.warn_once("build_failed", f"background: {type(exc).__name__}: {exc}")
                log.debug("kiln: background compile failed", exc_info=True)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
