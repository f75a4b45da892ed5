"""Bearer tokens against guessing, tenants and public binds: failed tokens are throttled per
token and per address while valid ones always pass, a client token reads only its own jobs, weak admin tokens refuse a public bind, and
docs and readiness details need a token there."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.deps import TokenRoles
from service.auth import create_token
from service.context import ServiceContext
from service.queue import QueueUnavailable
from tests.service.helpers import wire_body

pytestmark = pytest.mark.services

STRONG_ADMIN = "kiln_a-long-random-admin-token-0123456789"
PUBLIC = {"host": "0.0.0.0", "admin_token": STRONG_ADMIN}
ADMIN = {"Authorization": "Bearer admin-secret"}  # pg_settings' configured admin token


@pytest.mark.slow
def test_bad_tokens_from_an_address_never_lock_out_its_valid_admin_token(
        pg_ctx: ServiceContext) -> None:
    # The outside tester's case: 20 bad tokens, then the real admin from the same address.
    with pg_ctx.transaction() as session:
        admin = create_token(session, "admin")
    stats = "/v1/admin/stats"
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        codes = [c.get(stats, headers={"Authorization": f"Bearer kiln_guess{i}"}).status_code
                 for i in range(25)]
        assert codes == [401] * 25
        assert c.get(stats, headers={"Authorization": f"Bearer {admin}"}).status_code == 200
        assert c.get(stats, headers={"Authorization": f"Bearer {STRONG_ADMIN}"}
                     ).status_code == 401  # not this app's configured token: a failure too
        assert c.get(stats, headers=ADMIN).status_code == 200


@pytest.mark.slow
def test_past_the_address_cap_bad_tokens_get_429_with_backoff_and_valid_ones_pass(
        pg_ctx: ServiceContext) -> None:
    with pg_ctx.transaction() as session:
        admin, client = create_token(session, "admin"), create_token(session, "client")
    lookup = f"/v1/schedules/{'a' * 64}"
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        limit = c.app.state.auth_failures.per_address.limit
        codes = [c.get(lookup, headers={"Authorization": f"Bearer kiln_guess{i}"})
                 for i in range(limit + 3)]
        assert [r.status_code for r in codes] == [401] * (limit - 1) + [429] * 4
        assert codes[-1].json()["error"]["code"] == "too_many_failures"
        waits = [int(r.headers["retry-after"]) for r in codes[limit - 1:]]
        assert waits == sorted(waits) and waits[-1] >= 4  # 1, 2, 4, 8 s: doubling
        # Tokens this address never used before still pass, during the backoff.
        assert c.get(lookup, headers={"Authorization": f"Bearer {client}"}).status_code == 404
        assert c.get("/v1/admin/stats", headers={"Authorization": f"Bearer {admin}"}
                     ).status_code == 200
        assert c.get("/v1/admin/stats", headers=ADMIN).status_code == 200


@pytest.mark.slow
def test_a_token_that_keeps_failing_is_refused_without_a_lookup(pg_ctx: ServiceContext) -> None:
    with pg_ctx.transaction() as session:
        good = create_token(session, "client")
    lookup = f"/v1/schedules/{'a' * 64}"
    bad = {"Authorization": "Bearer kiln_revoked-in-a-job-environment"}
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        limit = c.app.state.auth_failures.per_token.limit
        codes = [c.get(lookup, headers=bad).status_code for _ in range(limit + 1)]
        # The limit-th failure starts the backoff; the next is refused before any lookup.
        assert codes == [401] * (limit - 1) + [429, 429]
        c.app.state.token_roles = TokenRoles(10.0)  # no cached answer: a lookup would be needed

        def no_lookup(*_args: object) -> None:
            raise AssertionError("a token in backoff was looked up")

        c.app.state.token_roles._resolve = no_lookup
        refused = c.get(lookup, headers=bad)
        assert refused.status_code == 429 and "this token failed too often" in refused.text
        # Other tokens from the same address are untouched by this token's backoff.
        c.app.state.token_roles = TokenRoles(10.0)
        assert c.get(lookup, headers={"Authorization": f"Bearer {good}"}).status_code == 404


@pytest.mark.slow
def test_a_client_token_reads_only_the_jobs_it_submitted(pg_ctx: ServiceContext) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update=PUBLIC)
    with pg_ctx.transaction() as session:
        alice, bob = create_token(session, "client"), create_token(session, "client")
    as_alice, as_bob = ({"Authorization": f"Bearer {t}"} for t in (alice, bob))
    admin = {"Authorization": f"Bearer {STRONG_ADMIN}"}
    with TestClient(create_app(ctx=pg_ctx), base_url="http://kiln.example") as c:
        job_id = c.post("/v1/graphs", json=wire_body(), headers=as_alice).json()["job_id"]
        assert c.get(f"/v1/jobs/{job_id}", headers=as_alice).status_code == 200
        hidden = c.get(f"/v1/jobs/{job_id}", headers=as_bob)
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
        # Enumerating ids shows Bob nothing, not even which ids exist.
        assert {c.get(f"/v1/jobs/{i}", headers=as_bob).status_code
                for i in range(1, job_id + 3)} == {404}
        assert c.get(f"/v1/jobs/{job_id}", headers=admin).status_code == 200
        # Submitting the same graph makes Bob an owner of the one shared job.
        assert c.post("/v1/graphs", json=wire_body(), headers=as_bob).json()["job_id"] == job_id
        assert c.get(f"/v1/jobs/{job_id}", headers=as_bob).status_code == 200


@pytest.mark.parametrize("weak", ["admin-secret", "a" * 40, "kiln_0123456789abcdef"])
def test_a_weak_admin_token_refuses_a_public_bind(pg_ctx: ServiceContext, weak: str) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update={**PUBLIC, "admin_token": weak})
    with pytest.raises(ValueError, match="KILN_ADMIN_TOKEN is too weak"):
        create_app(ctx=pg_ctx)
    # On loopback the same token still starts the embedded default.
    pg_ctx.settings = pg_ctx.settings.model_copy(update={"host": "127.0.0.1"})
    create_app(ctx=pg_ctx)


@pytest.mark.slow
def test_docs_and_readiness_details_need_a_token_on_a_public_bind(pg_ctx: ServiceContext) -> None:
    class DownQueue(type(pg_ctx.queue)):
        def ping(self) -> None:
            raise QueueUnavailable("Redis does not answer: Error connecting to 10.9.8.7:6379")

    pg_ctx.queue.__class__ = DownQueue
    pg_ctx.settings = pg_ctx.settings.model_copy(update=PUBLIC)
    with pg_ctx.transaction() as session:
        token = create_token(session, "client")
    bearer = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(ctx=pg_ctx), base_url="http://kiln.example") as c:
        for path in ("/docs", "/openapi.json", "/docs/static/swagger-ui.css"):
            assert c.get(path).status_code == 401, path
        assert c.get("/openapi.json", headers=bearer).json()["paths"]
        assert c.get("/docs", headers=bearer).status_code == 200
        anonymous = c.get("/readyz")
        assert anonymous.status_code == 503 and anonymous.json() == {"status": "not_ready"}
        detailed = c.get("/readyz", headers=bearer)
        assert detailed.status_code == 503 and detailed.json()["checks"]["queue"].startswith("down")
        assert "10.9.8.7" not in detailed.text
        assert c.get("/readyz", headers={"Authorization": "Bearer kiln_nope"}).status_code == 401
        assert c.get("/healthz").status_code == 200
