"""Per-token rate limit (a token bucket per identity) and the throttle on failed
authentication (per client address).

Embedded default (no KILN_REDIS_URL): both live in the API process. With Redis they live
there, shared by every API process (`kiln serve --workers N`, several hosts), so a fleet on
one token gets the limit once, not once per process. When Redis does not answer, each
process falls back to its in-process limiter (logged once per outage) and asks Redis again
after a few seconds: an outage loosens the limit to one per process, never takes the API down
or lets everything through.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any

from service.queue import keys
from service.settings import Settings

log = logging.getLogger(__name__)


class RateLimiter:
    """`rate` requests per second sustained, `burst` at once, per identity; rate 0 = off.
    Buckets live in this process: with several API processes the limit applies per process."""

    shared = False  # True: calls wait on the network (run them off the event loop)

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

    shared = False

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


# Scripts run atomically in Redis, on Redis's clock (API hosts' clocks need not agree).
_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
"""

_TAKE = _NOW + """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens < 1 then wait = (1 - tokens) / rate else tokens = tokens - 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""

_BLOCKED = _NOW + """
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. tostring(now - window))
if redis.call('ZCARD', KEYS[1]) < limit then return '0' end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tostring(math.max(0, window - (now - tonumber(oldest[2]))))
"""

_FAILED = _NOW + """
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(limit + 1))
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
return '1'
"""


class _Redis:
    """The limiters' Redis connection. While Redis does not answer, `run` returns None
    without trying for `retry_s` (the caller uses its in-process twin); one warning per
    outage. Short timeouts: a limiter sits on every request's path."""

    def __init__(self, url: str, retry_s: float = 5.0, timeout_s: float = 0.5) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                           socket_connect_timeout=timeout_s)
        self.errors = (redis.exceptions.RedisError, OSError)
        self.retry_s = retry_s
        self._retry_at = 0.0
        self._down = False

    def script(self, text: str) -> Any:
        return self.client.register_script(text)

    def run(self, script: Any, key: str, *args: object) -> float | None:
        """The script's numeric answer, or None while Redis is out."""
        if time.monotonic() < self._retry_at:
            return None
        try:
            answer = float(script(keys=[key], args=list(args)))
        except self.errors as exc:
            self._retry_at = time.monotonic() + self.retry_s
            if not self._down:
                self._down = True
                log.warning("Redis does not answer the rate limiter (%s); limiting per API "
                            "process until it does", exc)
            return None
        if self._down:
            self._down = False
            log.info("Redis answers again: rate limits are shared again")
        return answer


class SharedRateLimiter(RateLimiter):
    """The token buckets in Redis, one per identity, shared by every API process; the
    in-process buckets while Redis is out."""

    shared = True

    def __init__(self, redis: _Redis, prefix: str, rate: float, burst: int) -> None:
        super().__init__(rate, burst)
        self._redis, self._prefix, self._take = redis, prefix, redis.script(_TAKE)

    def allow(self, ident: str) -> float:
        if self.rate <= 0:
            return 0.0
        wait = self._redis.run(self._take, keys.rate_bucket(self._prefix, ident),
                               self.rate, self.burst)
        return super().allow(ident) if wait is None else wait


class SharedFailureThrottle(FailureThrottle):
    """Failed authentications counted in Redis per address, across every API process; in
    this process while Redis is out."""

    shared = True

    def __init__(self, redis: _Redis, prefix: str, limit: int = 20, window_s: float = 60.0) -> None:
        super().__init__(limit, window_s)
        self._redis, self._prefix = redis, prefix
        self._blocked, self._failed = redis.script(_BLOCKED), redis.script(_FAILED)

    def blocked_for(self, address: str) -> float:
        wait = self._redis.run(self._blocked, keys.auth_failures(self._prefix, address),
                               self.limit, self.window_s)
        return super().blocked_for(address) if wait is None else wait

    def failed(self, address: str) -> None:
        done = self._redis.run(self._failed, keys.auth_failures(self._prefix, address),
                               self.limit, self.window_s, os.urandom(8).hex())
        if done is None:
            super().failed(address)


def make_limiters(settings: Settings) -> tuple[RateLimiter, FailureThrottle]:
    """The per-token rate limiter and the failed-authentication throttle of one API process:
    shared through Redis when KILN_REDIS_URL is set, in this process otherwise."""
    if not settings.redis_url:
        return RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst), FailureThrottle()
    redis = _Redis(settings.redis_url)
    return (SharedRateLimiter(redis, settings.redis_prefix, settings.rate_limit_per_s,
                              settings.rate_limit_burst),
            SharedFailureThrottle(redis, settings.redis_prefix))
