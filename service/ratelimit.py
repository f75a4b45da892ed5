"""Per-token rate limit (a token bucket per identity) and the throttle on failed
authentication (per client address), both in the API process."""

from __future__ import annotations

import threading
import time
from collections import deque


class RateLimiter:
    """`rate` requests per second sustained, `burst` at once, per identity; rate 0 = off.
    Buckets live in this process: with several API processes the limit applies per process."""

    def __init__(self, rate: float, burst: int, max_idents: int = 100_000) -> None:
        self.rate, self.burst, self.max_idents = rate, burst, max_idents
        self._buckets: dict[str, tuple[float, float]] = {}  # ident -> (tokens, at)
        self._lock = threading.Lock()

    def allow(self, ident: str) -> float:
        """0 when the request may go ahead, else the seconds to wait before retrying."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(ident, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[ident] = (tokens, now)
                return (1.0 - tokens) / self.rate
            if len(self._buckets) >= self.max_idents and ident not in self._buckets:
                self._buckets.clear()  # bounded memory under an identity flood
            self._buckets[ident] = (tokens - 1.0, now)
            return 0.0


class FailureThrottle:
    """Refuse an address after `limit` failed authentications (unknown bearer tokens, wrong
    dashboard logins) within `window_s` seconds, so tokens cannot be guessed at speed."""

    def __init__(self, limit: int = 20, window_s: float = 60.0, max_addresses: int = 10_000) -> None:
        self.limit, self.window_s, self.max_addresses = limit, window_s, max_addresses
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}

    def blocked_for(self, address: str) -> float:
        """Seconds until `address` may try again (0 when it may now)."""
        now = time.monotonic()
        with self._lock:
            failures = self._failures.get(address)
            if not failures:
                return 0.0
            while failures and now - failures[0] > self.window_s:
                failures.popleft()
            if len(failures) < self.limit:
                return 0.0
            return self.window_s - (now - failures[0])

    def failed(self, address: str) -> None:
        """Record one failed authentication from `address`."""
        with self._lock:
            if len(self._failures) > self.max_addresses:  # bounded memory under a spray
                self._failures.clear()
            self._failures.setdefault(address, deque(maxlen=self.limit)).append(time.monotonic())
