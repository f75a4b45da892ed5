"""Rate limit and failed-token throttle shared through a real Redis: two limiter instances
(or two apps) stand for two API processes on one token; a Redis outage falls back to the
per-process limit and the API keeps answering."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.auth import create_token
from service.context import ServiceContext
from service.ratelimit import PER_TOKEN, AuthFailures, FailureThrottle, RateLimiter, make_limiters
from service.settings import Settings
from tests.service.private_services import PrivateRedis

pytestmark = pytest.mark.services


def _settings(redis_url: str | None, prefix: str = "kiln:", **extra: Any) -> Settings:
    return Settings(database_url="sqlite://", redis_url=redis_url, redis_prefix=prefix, **extra)


def test_the_embedded_default_limits_in_process() -> None:
    limiter, failures = make_limiters(_settings(None))
    assert type(limiter) is RateLimiter and type(failures) is AuthFailures
    for throttle in (failures.per_token, failures.per_address):
        assert type(throttle) is FailureThrottle and not throttle.shared
    assert not limiter.shared
    assert failures.per_address.limit >= 5 * failures.per_token.limit


def test_two_api_processes_share_one_token_bucket(redis_url: str, redis_prefix: str) -> None:
    settings = _settings(redis_url, redis_prefix, rate_limit_per_s=0.5, rate_limit_burst=6)
    (one, _), (two, _) = make_limiters(settings), make_limiters(settings)
    assert one.shared and two.shared
    answers = [(one if i % 2 else two).allow("token:abc") for i in range(12)]
    assert answers[:6] == [0.0] * 6  # the burst, once for the pair, not once per process
    assert all(0 < wait <= 2.0 for wait in answers[6:])
    assert one.allow("token:other") == 0.0  # buckets are per identity
    # The same load on two in-process limiters gets through twice as often.
    local = [RateLimiter(0.5, 6), RateLimiter(0.5, 6)]
    assert sum(local[i % 2].allow("token:abc") == 0 for i in range(12)) == 12


def test_failed_tokens_count_across_api_processes(redis_url: str, redis_prefix: str) -> None:
    settings = _settings(redis_url, redis_prefix)
    (_, a), (_, b) = make_limiters(settings), make_limiters(settings)
    one, two = a.per_address, b.per_address
    assert one.shared and two.shared
    for i in range(one.limit - 1):
        assert (one if i % 2 else two).blocked_for("ip:10.0.0.7") == 0.0
        assert (one if i % 2 else two).failed("ip:10.0.0.7") == 0.0
    # The limit-th failure, counted once for the pair: base_s, then doubling (Redis's clock).
    assert 0.9 * one.base_s < one.failed("ip:10.0.0.7") <= one.base_s
    for throttle in (one, two):
        assert 0.5 * one.base_s < throttle.blocked_for("ip:10.0.0.7") <= one.base_s
    assert 1.9 * one.base_s < two.failed("ip:10.0.0.7") <= 2 * one.base_s
    assert one.blocked_for("ip:10.0.0.8") == 0.0
    # The per-token throttle: its own keys, a lower limit.
    for _ in range(PER_TOKEN["limit"]):
        wait = (a.per_token if _ % 2 else b.per_token).failed("token:0123456789abcdef")
    assert 0 < wait <= PER_TOKEN["base_s"] and b.per_token.blocked_for("token:0123456789abcdef") > 0


def test_backoff_doubles_per_failure_up_to_its_cap_and_a_quiet_window_forgets() -> None:
    throttle = FailureThrottle(limit=3, window_s=0.2, base_s=0.01, max_s=0.04)
    waits = [throttle.failed("token:x") for _ in range(7)]
    assert waits[:2] == [0.0, 0.0]
    for got, want in zip(waits[2:], [0.01, 0.02, 0.04, 0.04, 0.04], strict=True):
        assert 0.8 * want < got <= want * 1.001
    assert throttle.blocked_for("token:x") > 0 and throttle.blocked_for("token:y") == 0.0
    time.sleep(0.3)  # past the refusal and the window: the run is over
    assert throttle.blocked_for("token:x") == 0.0 and throttle.failed("token:x") == 0.0


def test_the_redis_backoff_matches_the_in_process_one(redis_url: str, redis_prefix: str) -> None:
    from service.ratelimit import SharedFailureThrottle, _Redis

    shared = SharedFailureThrottle(_Redis(redis_url), redis_prefix, limit=2, window_s=60,
                                   base_s=10.0, max_s=35.0)
    local = FailureThrottle(limit=2, window_s=60, base_s=10.0, max_s=35.0)
    for _ in range(6):
        got, want = shared.failed("ip:10.0.0.5"), local.failed("ip:10.0.0.5")
        assert abs(got - want) < 0.5, (got, want)
    assert 34 < shared.blocked_for("ip:10.0.0.5") <= 35


def test_two_apps_on_one_redis_refuse_a_token_past_the_shared_limit(
        pg_ctx: ServiceContext, redis_url: str, redis_prefix: str) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update={
        "redis_url": redis_url, "redis_prefix": redis_prefix,
        "rate_limit_per_s": 0.2, "rate_limit_burst": 4})
    with pg_ctx.transaction() as session:
        token = create_token(session, "client")
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as a, \
            TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as b:
        codes = [(a if i % 2 else b).get(f"/v1/schedules/{'a' * 64}", headers=headers)
                 for i in range(6)]
        assert [r.status_code for r in codes] == [404] * 4 + [429] * 2
        assert codes[-1].json()["error"]["code"] == "rate_limited"
        assert int(codes[-1].headers["retry-after"]) >= 1


def test_a_redis_outage_falls_back_to_the_per_process_limit(
        caplog: pytest.LogCaptureFixture) -> None:
    redis = PrivateRedis()
    redis.start()
    try:
        settings = _settings(redis.url, rate_limit_per_s=0.1, rate_limit_burst=3)
        limiter, failures = make_limiters(settings)
        throttle = failures.per_token
        assert limiter.allow("token:x") == 0.0  # one taken from the shared bucket
        redis.stop()
        with caplog.at_level(logging.WARNING, logger="service.ratelimit"):
            # This process's own bucket: the full burst, then refusals; never an error.
            answers = [limiter.allow("token:x") for _ in range(5)]
            for _ in range(throttle.limit):
                throttle.failed("token:0123456789abcdef")
            assert throttle.blocked_for("token:0123456789abcdef") > 0
        assert answers[:3] == [0.0] * 3 and all(w > 0 for w in answers[3:])
        outage = [r for r in caplog.records if "does not answer the rate limiter" in r.message]
        assert len(outage) == 1  # one warning per outage, not one per request
        # Back up (empty): after the retry pause the shared bucket is used again.
        redis.start()
        limiter._redis._retry_at = 0.0
        assert limiter.allow("token:x") == 0.0
        assert limiter._redis.client.exists(f"{settings.redis_prefix}rate:token:x") == 1
    finally:
        redis.close()


def test_the_api_answers_while_the_limiters_redis_is_down(pg_ctx: ServiceContext) -> None:
    from tests.service.helpers import free_port

    pg_ctx.settings = pg_ctx.settings.model_copy(update={
        "redis_url": f"redis://127.0.0.1:{free_port()}/0"})  # nothing listens there
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        assert c.app.state.limiter.shared
        codes = {c.get(f"/v1/schedules/{'a' * 64}").status_code for _ in range(3)}
        assert codes == {404}
        assert c.get("/v1/schedules/x", headers={"Authorization": "Bearer kiln_nope"}
                     ).status_code == 401
