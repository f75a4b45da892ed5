"""Rate limit and failed-token throttle shared through a real Redis: two limiter instances
(or two apps) stand for two API processes on one token; a Redis outage falls back to the
per-process limit and the API keeps answering."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.auth import create_token
from service.context import ServiceContext
from service.ratelimit import FailureThrottle, RateLimiter, make_limiters
from service.settings import Settings
from tests.service.private_services import PrivateRedis

pytestmark = pytest.mark.services


def _settings(redis_url: str | None, prefix: str = "kiln:", **extra: Any) -> Settings:
    return Settings(database_url="sqlite://", redis_url=redis_url, redis_prefix=prefix, **extra)


def test_the_embedded_default_limits_in_process() -> None:
    limiter, throttle = make_limiters(_settings(None))
    assert type(limiter) is RateLimiter and type(throttle) is FailureThrottle
    assert not limiter.shared and not throttle.shared


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
    (_, one), (_, two) = make_limiters(settings), make_limiters(settings)
    for i in range(20):
        assert (one if i % 2 else two).blocked_for("10.0.0.7") == 0.0
        (one if i % 2 else two).failed("10.0.0.7")
    for throttle in (one, two):
        assert 55.0 < throttle.blocked_for("10.0.0.7") <= 60.0
    assert one.blocked_for("10.0.0.8") == 0.0


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
        limiter, throttle = make_limiters(settings)
        assert limiter.allow("token:x") == 0.0  # one taken from the shared bucket
        redis.stop()
        with caplog.at_level(logging.WARNING, logger="service.ratelimit"):
            # This process's own bucket: the full burst, then refusals; never an error.
            answers = [limiter.allow("token:x") for _ in range(5)]
            for _ in range(20):
                throttle.failed("10.0.0.9")
            assert throttle.blocked_for("10.0.0.9") > 0
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
