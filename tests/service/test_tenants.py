"""Tenants (service/tenants.py) over real HTTP (uvicorn on a loopback port), on SQLite and
PostgreSQL: a plan one tenant stored never reaches another tenant's clients or jobs, its own
tenant's next lookup and job do get it, and a plan an admin published reaches every tenant.
Also the migration that adds tenants to tokens and plans."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sqlalchemy import create_engine, text

import compiler
import kiln
from compiler.wire.plan import parse_plan, plan_text
from kiln import plans
from kiln import session as kiln_session
from service.auth import create_token
from service.context import ServiceContext
from service.migrate import alembic_config, upgrade
from tests.dashboard.live import LiveService
from tests.kiln.conftest import kiln_state  # noqa: F401 - the client's fixture, used below
from tests.kiln.helpers import fresh_process

pytestmark = pytest.mark.services

ADMIN = {"Authorization": "Bearer admin-secret"}  # the test settings' configured admin token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def inference_plan(key: str, scale: float, shape: tuple[int, ...] = (4, 3)) -> str:
    """The canonical text of a valid inference plan of `x * scale + 1`, under `key`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(*shape)
    gm = make_fx(lambda x: (x * scale + 1,))(x)
    return plan_text(parse_plan({
        "format": "kiln.plan/1", "key": key, "kind": "inference", "inputs": 1,
        "mutated_inputs": [], "outputs": [{"requires_grad": False}],
        "forward": compiler.to_wire(gm, [x]), "backward": None}))


@pytest.fixture
def live(any_ctx: ServiceContext) -> Iterator[LiveService]:
    with LiveService(any_ctx) as service:
        yield service


@pytest.fixture
def tokens(any_ctx: ServiceContext) -> dict[str, str]:
    """Client tokens of tenants team-a (two), team-b and team-c, and an admin token."""
    with any_ctx.transaction() as session:
        return {"a": create_token(session, "client", tenant="team-a"),
                "a2": create_token(session, "client", tenant="team-a"),
                "b": create_token(session, "client", tenant="team-b"),
                "c": create_token(session, "client", tenant="team-c"),
                "admin": create_token(session, "admin", tenant="ops")}


@pytest.mark.slow
def test_a_plan_reaches_only_its_tenant_until_an_admin_publishes_it(
        live: LiveService, tokens: dict[str, str]) -> None:
    key = "ab" * 32
    mine, theirs = inference_plan(key, 2.0), inference_plan(key, 1000.0)
    json = {"content-type": "application/json"}
    with httpx.Client(base_url=live.url, timeout=30) as http:
        def get(who: str | None) -> httpx.Response:
            return http.get(f"/v1/plans/{key}", headers=bearer(tokens[who]) if who else {})

        def put(who: str, body: str) -> httpx.Response:
            return http.put(f"/v1/plans/{key}", content=body,
                            headers={**json, **bearer(tokens[who])})

        assert put("a", mine).status_code == 201
        assert get("a").text == mine and get("a2").text == mine  # the tenant, any token
        for other in ("b", "c", None):  # None: anonymous on loopback, the tenant `local`
            assert get(other).status_code == 404, other

        # Tenant B storing the key stores its own (201, as if none existed: nothing of A's
        # shows), checked in full, and A's stays A's.
        assert put("b", '{"format": "nonsense"}').status_code == 422
        assert put("b", theirs).status_code == 201
        assert get("b").text == theirs and get("a").text == mine
        assert put("a", '{"format": "nonsense"}').json() == {"key": key, "created": False}

        listed = http.get("/v1/admin/plans", params={"key": key}, headers=ADMIN).json()["items"]
        assert sorted(p["tenant"] for p in listed) == ["team-a", "team-b"]
        assert all(p["published_from"] is None and "body" not in p for p in listed)

        # Publishing takes an admin token; then every tenant without its own plan reads it.
        publish = f"/v1/admin/plans/{key}/publish"
        assert http.post(publish, params={"tenant": "team-a"},
                         headers=bearer(tokens["a"])).status_code == 403
        assert http.post(publish, params={"tenant": "team-x"},
                         headers=ADMIN).status_code == 404
        done = http.post(publish, params={"tenant": "team-a"}, headers=bearer(tokens["admin"]))
        assert done.status_code == 200 and done.json() == {
            "key": key, "tenant": "team-a", "published": True, "created": True}
        assert get("c").text == mine and get(None).text == mine
        assert get("b").text == theirs  # a tenant's own plan comes first
        again = http.post(publish, params={"tenant": "team-a"}, headers=ADMIN)
        assert again.status_code == 200 and again.json()["created"] is False
        clash = http.post(publish, params={"tenant": "team-b"}, headers=ADMIN)
        assert clash.status_code == 409 and "invalidate it first" in clash.text
        (published,) = http.get("/v1/admin/plans", params={"tenant": "*"},
                                headers=ADMIN).json()["items"]
        assert published["published_from"] == "team-a" and published["key"] == key

        # Withdrawn: the published copy only; each tenant keeps its own.
        gone = http.post(f"/v1/admin/plans/{key}/invalidate", params={"tenant": "*"},
                         headers=ADMIN)
        assert gone.status_code == 200 and gone.json()["deleted"] == 1
        assert get("c").status_code == 404 and get("a").text == mine and get("b").text == theirs
        bad = http.post(publish, params={"tenant": "no tenant"}, headers=ADMIN)
        assert bad.status_code == 422 and "tenant name" in bad.text


def _plan_key_of(fn: Any, x: torch.Tensor) -> str:
    """The plan key kiln computes for `fn`'s dynamo graph under no_grad."""
    captured = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        captured.append(plans.plan_key(gm, list(example_inputs)))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=keep)(x)
    return captured[0]


def _job(url: str, token: str, cache_dir: Path, fn: Any, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """One training job's process as far as plans go: a fresh client state with its own
    cache, its tenant's token, the compiled function's output and kiln's counters."""
    fresh_process()
    kiln.configure(url=url, token=token, cache_dir=cache_dir, mode="async")
    with torch.no_grad():
        out = torch.compile(copy.deepcopy(fn), backend="kiln", dynamic=False)(x)
    assert kiln_session.wait_plans(timeout=60)
    return out, kiln.stats()


@pytest.mark.slow
@pytest.mark.usefixtures("kiln_state")
def test_a_plan_one_tenant_stored_for_a_key_is_not_run_by_another_tenants_job(
        live: LiveService, tokens: dict[str, str], tmp_path: Path) -> None:
    """The outside tester's case: with one client token a plan was stored for a key whose
    forward computes something else; a job with another token used it (max abs diff 999)."""
    def model(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    x = torch.randn(4, 3)
    key = _plan_key_of(model, x)
    forged = inference_plan(key, 1000.0)
    stored = httpx.put(f"{live.url}/v1/plans/{key}", content=forged, timeout=30,
                       headers={"content-type": "application/json", **bearer(tokens["a"])})
    assert stored.status_code == 201

    # Tenant A's own job runs what tenant A stored: the forged plan is usable as it stands
    # (so the next assertion is about tenants, not about a plan that does not fit).
    out, stats = _job(live.url, tokens["a"], tmp_path / "job-a", model, x)
    torch.testing.assert_close(out, x * 1000 + 1)
    assert stats["plans_used"] == 1

    # Tenant B's job never sees it: AOTAutograd runs, the numbers are right, and B's own
    # plan is stored for B.
    out, stats = _job(live.url, tokens["b"], tmp_path / "job-b", model, x)
    torch.testing.assert_close(out, model(x))
    assert "plans_used" not in stats and stats["plans_sent"] == 1
    served = httpx.get(f"{live.url}/v1/plans/{key}", headers=bearer(tokens["b"]), timeout=30)
    assert served.status_code == 200 and served.text != forged
    assert httpx.get(f"{live.url}/v1/plans/{key}", headers=bearer(tokens["a"]),
                     timeout=30).text == forged

    # Tenant B's next job, a fresh process with an empty cache, reuses B's own plan.
    out, stats = _job(live.url, tokens["b"], tmp_path / "job-b2", model, x)
    torch.testing.assert_close(out, model(x))
    assert stats["plans_used"] == 1 and "seconds:aot" not in stats


@pytest.mark.parametrize("backend_name", ["sqlite", "postgresql"])
def test_migration_0008_puts_existing_tokens_and_plans_in_the_default_tenant(
        backend_name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from alembic import command

    url = request.getfixturevalue("postgres_url") if backend_name == "postgresql" \
        else f"sqlite:///{tmp_path / 'k.db'}"
    upgrade(url, "0007")
    engine = create_engine(url)
    now = "2026-12-01 00:00:00+00:00"
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO api_tokens (token_hash, role, created_at, revoked) "
                              "VALUES (:h, 'client', :now, false)"), {"h": "f" * 64, "now": now})
            conn.execute(text("INSERT INTO plans (key, kind, body, bytes, created_at, hits) "
                              "VALUES (:k, 'inference', '{}', 2, :now, 3)"),
                         {"k": "ab" * 32, "now": now})
        upgrade(url)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT tenant FROM api_tokens")).scalar_one() == "default"
            row = conn.execute(text("SELECT key, tenant, body, hits, published_from FROM plans")
                               ).one()
            assert tuple(row) == ("ab" * 32, "default", "{}", 3, None)
            # A second tenant's plan of the same key, and a published one, fit beside it.
            for tenant in ("team-a", "*"):
                conn.execute(text("INSERT INTO plans (key, tenant, kind, body, bytes, "
                                  "created_at, hits) VALUES (:k, :t, 'inference', :b, 2, "
                                  ":now, 0)"), {"k": "ab" * 32, "t": tenant, "b": f'"{tenant}"',
                                                "now": now})
        engine.dispose()
        command.downgrade(alembic_config(url), "0007")  # one plan per key: the published one
        with engine.begin() as conn:
            assert conn.execute(text("SELECT body FROM plans")).scalars().all() == ['"*"']
        upgrade(url)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT tenant FROM plans")).scalars().all() == ["default"]
    finally:
        engine.dispose()
