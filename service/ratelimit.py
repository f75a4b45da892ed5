"""Per-token rate limit (a token bucket per identity) and the throttles on failed
authentication (per presented token and per client address, with exponential backoff).

Embedded default (no KILN_REDIS_URL): both live in the API process. With Redis they live
there, shared by every API process (`kiln serve --workers N`, several hosts), so a fleet on
one token gets the limit once, not once per process. When Redis does not answer, each
process falls back to its in-process limiter (logged once per outage) and asks Redis again
after a few seconds: an outage loosens the limit to one per process, never takes the API down
or lets everything through.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
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


def backoff_s(count: int, limit: int, base_s: float, max_s: float) -> float:
    """How long an identity with `count` failures in a row is refused: nothing below
    `limit`, then `base_s` doubled by each further failure, at most `max_s`."""
    if count < limit:
        return 0.0
    return min(max_s, base_s * 2.0 ** min(count - limit, 60))


class FailureThrottle:
    """Failed authentications per identity (a presented token's hash prefix, or a client
    address): after `limit` failures in a row, the identity is refused for `base_s`, doubled
    by each further failure, at most `max_s` (exponential backoff). A run ends `window_s`
    after its last failure once no refusal is in force; then the count starts again."""

    shared = False

    def __init__(self, limit: int, window_s: float = 60.0, base_s: float = 1.0,
                 max_s: float = 300.0, max_idents: int = 10_000) -> None:
        self.limit, self.window_s, self.base_s, self.max_s = limit, window_s, base_s, max_s
        self.max_idents = max_idents
        self._lock = threading.Lock()
        self._state: dict[str, tuple[int, float, float]] = {}  # ident -> (count, last, until)

    def blocked_for(self, ident: str) -> float:
        """Seconds until `ident` may try again (0 when it may now)."""
        with self._lock:
            state = self._state.get(ident)
        return max(0.0, state[2] - time.monotonic()) if state else 0.0

    def failed(self, ident: str) -> float:
        """Record one failed authentication of `ident`; the refusal now in force (seconds)."""
        now = time.monotonic()
        with self._lock:
            count, last, until = self._state.get(ident, (0, now, 0.0))
            if now > max(last + self.window_s, until):
                count = 0
            count += 1
            until = max(until, now + backoff_s(count, self.limit, self.base_s, self.max_s))
            if len(self._state) >= self.max_idents and ident not in self._state:
                self._state.clear()  # bounded memory under a spray
            self._state[ident] = (count, now, until)
        return max(0.0, until - now)


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
local until_ = tonumber(redis.call('HGET', KEYS[1], 'until')) or 0
return tostring(math.max(0, until_ - now))
"""

_FAILED = _NOW + """
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local base, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'count', 'last', 'until')
local count = tonumber(state[1]) or 0
local last = tonumber(state[2]) or now
local until_ = tonumber(state[3]) or 0
if now > math.max(last + window, until_) then count = 0 end
count = count + 1
if count >= limit then
  until_ = math.max(until_, now + math.min(cap, base * 2 ^ math.min(count - limit, 60)))
end
redis.call('HSET', KEYS[1], 'count', tostring(count), 'last', tostring(now),
           'until', tostring(until_))
redis.call('PEXPIRE', KEYS[1], math.ceil((window + cap) * 1000))
return tostring(math.max(0, until_ - now))
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
    """Failed authentications counted in Redis per identity, across every API process; in
    this process while Redis is out."""

    shared = True

    def __init__(self, redis: _Redis, prefix: str, limit: int, window_s: float = 60.0,
                 base_s: float = 1.0, max_s: float = 300.0) -> None:
        super().__init__(limit, window_s, base_s, max_s)
        self._redis, self._prefix = redis, prefix
        self._blocked, self._failed = redis.script(_BLOCKED), redis.script(_FAILED)

    def blocked_for(self, ident: str) -> float:
        wait = self._redis.run(self._blocked, keys.auth_failures(self._prefix, ident))
        return super().blocked_for(ident) if wait is None else wait

    def failed(self, ident: str) -> float:
        wait = self._redis.run(self._failed, keys.auth_failures(self._prefix, ident),
                               self.limit, self.window_s, self.base_s, self.max_s)
        return super().failed(ident) if wait is None else wait


# A token that keeps failing (revoked, mistyped) is refused without a lookup after a few
# tries; an address gets a much higher cap, since a valid token from it always passes.
PER_TOKEN = {"limit": 5, "window_s": 60.0, "base_s": 1.0, "max_s": 300.0}
PER_ADDRESS = {"limit": 100, "window_s": 60.0, "base_s": 1.0, "max_s": 900.0}


@dataclass(frozen=True)
class AuthFailures:
    """The throttles on failed authentication (bearer tokens and dashboard logins), per
    failing identity and per address. A presented token refused by `per_token` is not looked
    up; a valid token always passes `per_address` (a flood of bad tokens from an address
    does not lock its real operator out): only the address's failures are answered 429."""

    per_token: FailureThrottle
    per_address: FailureThrottle

    @staticmethod
    def token_ident(digest: str) -> str:
        """The throttle's identity of a presented token, from its sha256 hex."""
        return f"token:{digest[:16]}"

    @staticmethod
    def address_ident(address: str) -> str:
        return f"ip:{address}"


def make_limiters(settings: Settings) -> tuple[RateLimiter, AuthFailures]:
    """The per-token rate limiter and the failed-authentication throttles of one API process:
    shared through Redis when KILN_REDIS_URL is set, in this process otherwise."""
    if not settings.redis_url:
        return (RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst),
                AuthFailures(FailureThrottle(**PER_TOKEN), FailureThrottle(**PER_ADDRESS)))
    redis = _Redis(settings.redis_url)
    prefix = settings.redis_prefix
    return (SharedRateLimiter(redis, prefix, settings.rate_limit_per_s,
                              settings.rate_limit_burst),
            AuthFailures(SharedFailureThrottle(redis, prefix, **PER_TOKEN),
                         SharedFailureThrottle(redis, prefix, **PER_ADDRESS)))
