"""In-process queue for the embedded default (`kiln serve`): same semantics, no Redis."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

from service.queue.base import Delivery, JobQueue


class _Lines:
    """One stream: a line per tenant and the tenants' turns (base.py says how they rotate)."""

    def __init__(self) -> None:
        self.lines: dict[str, deque[tuple[str, int]]] = {}
        self.places: dict[str, float] = {}  # tenants with messages -> place in the ring
        self.turn = 0

    def push(self, tenant: str, message_id: str, job_id: int) -> None:
        self.lines.setdefault(tenant, deque()).append((message_id, job_id))
        self.places.setdefault(tenant, self.turn - 0.5)

    def pop(self) -> tuple[str, str, int] | None:
        if not self.places:
            return None
        tenant = min(self.places, key=lambda t: (self.places[t], t))
        line = self.lines[tenant]
        message_id, job_id = line.popleft()
        self.turn += 1
        if line:
            self.places[tenant] = self.turn
        else:
            del self.places[tenant]
        return tenant, message_id, job_id

    def __len__(self) -> int:
        return sum(len(line) for line in self.lines.values())


class InProcessQueue(JobQueue):
    """Thread-safe streams with leases, held in memory (lost with the process; the database
    re-enqueues pending jobs at start through `lost_state`)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._cond = threading.Condition()
        self._streams: dict[str, _Lines] = {}
        self._pending: dict[str, tuple[Delivery, float, str]] = {}  # id -> (msg, since, who)
        self._ids = itertools.count(1)
        self._fresh = True
        self._wakes = 0  # `wake` calls: a waiting claim that sees it change returns

    def enqueue(self, stream: str, job_id: int, tenant: str) -> None:
        with self._cond:
            self._streams.setdefault(stream, _Lines()).push(tenant, f"{next(self._ids)}-0", job_id)
            self._cond.notify_all()

    def claim(self, streams: list[str], consumer: str, block_s: float) -> Delivery | None:
        deadline = time.monotonic() + block_s
        with self._cond:
            wakes = self._wakes
            while True:
                now = time.monotonic()
                for mid, (msg, since, _who) in list(self._pending.items()):
                    if msg.stream in streams and now - since >= self.lease_s:
                        self._pending[mid] = (msg, now, consumer)
                        return msg
                for name in streams:
                    lines = self._streams.get(name)
                    taken = lines.pop() if lines else None
                    if taken:
                        tenant, mid, job_id = taken
                        msg = Delivery(name, mid, job_id, tenant)
                        self._pending[mid] = (msg, now, consumer)
                        return msg
                left = deadline - now
                if left <= 0 or self._wakes != wakes:
                    return None
                self._cond.wait(min(left, self.lease_s))

    def wake(self) -> None:
        with self._cond:
            self._wakes += 1
            self._cond.notify_all()

    def touch(self, delivery: Delivery, consumer: str) -> None:
        with self._cond:
            if delivery.message_id in self._pending:
                self._pending[delivery.message_id] = (delivery, time.monotonic(), consumer)

    def ack(self, delivery: Delivery) -> None:
        with self._cond:
            self._pending.pop(delivery.message_id, None)

    def depth(self) -> dict[str, int]:
        with self._cond:
            out = {name: len(lines) for name, lines in self._streams.items()}
            for msg, _since, _who in self._pending.values():
                out[msg.stream] = out.get(msg.stream, 0) + 1
            return out

    def ping(self) -> None:
        return None

    def lost_state(self) -> bool:
        with self._cond:
            fresh, self._fresh = self._fresh, False
            return fresh
