"""In-process queue for the embedded default (`kiln serve`): same semantics, no Redis."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

from service.queue.base import Delivery, JobQueue


class InProcessQueue(JobQueue):
    """Thread-safe streams with leases, held in memory (lost with the process; the database
    re-enqueues pending jobs at start through `lost_state`)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._cond = threading.Condition()
        self._streams: dict[str, deque[tuple[str, int]]] = {}
        self._pending: dict[str, tuple[Delivery, float, str]] = {}  # id -> (msg, since, who)
        self._ids = itertools.count(1)
        self._fresh = True

    def enqueue(self, stream: str, job_id: int) -> None:
        with self._cond:
            self._streams.setdefault(stream, deque()).append((f"{next(self._ids)}-0", job_id))
            self._cond.notify_all()

    def claim(self, streams: list[str], consumer: str, block_s: float) -> Delivery | None:
        deadline = time.monotonic() + block_s
        with self._cond:
            while True:
                now = time.monotonic()
                for mid, (msg, since, _who) in list(self._pending.items()):
                    if msg.stream in streams and now - since >= self.lease_s:
                        self._pending[mid] = (msg, now, consumer)
                        return msg
                for name in streams:
                    queue = self._streams.get(name)
                    if queue:
                        mid, job_id = queue.popleft()
                        msg = Delivery(name, mid, job_id)
                        self._pending[mid] = (msg, now, consumer)
                        return msg
                left = deadline - now
                if left <= 0:
                    return None
                self._cond.wait(min(left, self.lease_s))

    def touch(self, delivery: Delivery, consumer: str) -> None:
        with self._cond:
            if delivery.message_id in self._pending:
                self._pending[delivery.message_id] = (delivery, time.monotonic(), consumer)

    def ack(self, delivery: Delivery) -> None:
        with self._cond:
            self._pending.pop(delivery.message_id, None)

    def depth(self) -> dict[str, int]:
        with self._cond:
            out = {name: len(q) for name, q in self._streams.items()}
            for msg, _since, _who in self._pending.values():
                out[msg.stream] = out.get(msg.stream, 0) + 1
            return out

    def ping(self) -> None:
        return None

    def lost_state(self) -> bool:
        with self._cond:
            fresh, self._fresh = self._fresh, False
            return fresh
