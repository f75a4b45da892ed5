"""Bearer tokens against guessing, tenants and public binds: failed tokens are throttled per
address, a client token reads only its own jobs, weak admin tokens refuse a public bind, and
docs and readiness details need a token there."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.auth import create_token
from service.context import ServiceContext
from service.queue import QueueUnavailable
from tests.service.helpers import wire_body

pytestmark = pytest.mark.services

STRONG_ADMIN = "kiln_a-long-random-admin-token-0123456789"
PUBLIC = {"host": "0.0.0.0", "admin_token": STRONG_ADMIN}


def test_guessing_bearer_tokens_is_throttled_per_address(pg_ctx: ServiceContext) -> None:
    with pg_ctx.transaction() as session:
        good = create_token(session, "client")
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        assert c.get(f"/v1/schedules/{'a' * 64}",
                     headers={"Authorization": f"Bearer {good}"}).status_code == 404
        codes = [c.get(f"/v1/schedules/{'a' * 64}",
                       headers={"Authorization": f"Bearer kiln_guess{i}"}).status_code
                 for i in range(25)]
        assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}
        blocked = c.get("/v1/admin/stats", headers={"Authorization": "Bearer kiln_guess-admin"})
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
        # A token this address used successfully before the lockout still works.
        assert c.get(f"/v1/schedules/{'a' * 64}",
                     headers={"Authorization": f"Bearer {good}"}).status_code == 404


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
