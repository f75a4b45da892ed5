"""Bearer tokens against guessing, tenants and public binds: failed tokens are throttled per
address, a client token reads only its own jobs, weak admin tokens refuse a public bind, and
docs and readiness details need a token there."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.auth import create_token
from service.context import ServiceContext
from tests.service.helpers import wire_body

pytestmark = pytest.mark.services


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
    pg_ctx.settings = pg_ctx.settings.model_copy(update={"host": "0.0.0.0"})
    with pg_ctx.transaction() as session:
        alice, bob = create_token(session, "client"), create_token(session, "client")
    as_alice, as_bob = ({"Authorization": f"Bearer {t}"} for t in (alice, bob))
    admin = {"Authorization": "Bearer admin-secret"}
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
