"""Per-token rate limit: a token bucket per identity, in the API process."""

from __future__ import annotations

import threading
import time


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
