"""Plans (kiln.plan/1) in the service: `PUT /v1/plans/{key}` stores a checked plan once per
key and tenant (first writer wins), `GET /v1/plans/{key}` serves its canonical text, an
admin deletes one; on SQLite and PostgreSQL, and the migration that adds the table (tenants:
tests/service/test_tenants.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect

import compiler
from compiler.wire.plan import parse_plan, plan_text
from service import store
from service.api.app import create_app
from service.api.openapi import PlanStored
from service.auth import create_token
from service.context import ServiceContext
from service.migrate import alembic_config, upgrade

# slow: each test starts the app, whose intake fork server imports torch and Triton (~4 s).
pytestmark = [pytest.mark.services, pytest.mark.slow]

ADMIN = {"Authorization": "Bearer admin-secret"}
KEY = "ab" * 32
JSON = {"content-type": "application/json"}


def plan_doc(key: str = KEY, scale: float = 2.0) -> dict[str, Any]:
    """A valid inference plan of `x * scale + 1` (one input, one output)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (x * scale + 1,))(torch.randn(4, 3))
    doc = {"format": "kiln.plan/1", "key": key, "kind": "inference", "inputs": 1,
           "mutated_inputs": [], "outputs": [{"requires_grad": False}],
           "forward": compiler.to_wire(gm, [torch.randn(4, 3)]), "backward": None}
    parse_plan(doc)  # the fixture itself is a valid plan
    return doc


def canonical(doc: dict[str, Any]) -> str:
    return plan_text(parse_plan(doc))


@pytest.fixture
def any_client(any_ctx: ServiceContext) -> Iterator[TestClient]:
    with TestClient(create_app(ctx=any_ctx), base_url="http://127.0.0.1") as c:
        yield c


def test_a_plan_round_trips_and_the_first_writer_wins(any_client: TestClient) -> None:
    first, second = plan_doc(), plan_doc(scale=3.0)
    assert canonical(first) != canonical(second)
    put = any_client.put(f"/v1/plans/{KEY}", json=first)
    assert put.status_code == 201, put.text
    assert PlanStored.model_validate(put.json()) == PlanStored(key=KEY, created=True)
    got = any_client.get(f"/v1/plans/{KEY}")
    assert got.status_code == 200 and got.headers["content-type"] == "application/json"
    assert got.text == canonical(first)
    assert parse_plan(got.content).to_json() == parse_plan(first).to_json()

    again = any_client.put(f"/v1/plans/{KEY}", json=second)
    assert again.status_code == 200 and again.json() == {"key": KEY, "created": False}
    assert any_client.get(f"/v1/plans/{KEY}").text == canonical(first)
    # A held key is answered before any check: the ranks that all found none and all send
    # the same plan at once cost one validation, not one each.
    unchecked = any_client.put(f"/v1/plans/{KEY}", json={"format": "nonsense"})
    assert unchecked.status_code == 200 and unchecked.json()["created"] is False
    assert any_client.get(f"/v1/plans/{KEY}").text == canonical(first)


def test_concurrent_puts_of_one_key_store_one_plan(any_ctx: ServiceContext) -> None:
    bodies = [f'{{"n":{i}}}' for i in range(32)]

    def put(body: str) -> bool:
        with any_ctx.transaction() as session:
            return store.put_plan(session, KEY, "local", "inference", body)

    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(put, bodies))
    assert created.count(True) == 1
    with any_ctx.transaction() as session:
        assert store.count_plans(session) == 1
        assert store.get_plan(session, KEY, "local") == bodies[created.index(True)]


def test_a_fetch_counts_a_hit_and_a_miss_counts_none(any_ctx: ServiceContext) -> None:
    from service.models import PlanRow

    with any_ctx.transaction() as session:
        assert store.put_plan(session, KEY, "local", "inference", "{}")
        assert store.get_plan(session, "cd" * 32, "local") is None
    for _ in range(3):
        with any_ctx.transaction() as session:
            assert store.get_plan(session, KEY, "local") == "{}"
    with any_ctx.transaction() as session:
        row = session.get(PlanRow, (KEY, "local"))
        assert row.hits == 3 and row.last_hit_at is not None and row.bytes == 2
        assert row.last_hit_at >= row.created_at and row.kind == "inference"
        assert store.count_plans(session) == 1  # the miss stored nothing


def test_a_plan_whose_key_is_not_the_urls_is_refused(client: TestClient) -> None:
    other = "cd" * 32
    r = client.put(f"/v1/plans/{other}", json=plan_doc())
    assert r.status_code == 422 and r.json()["error"]["code"] == "key_mismatch"
    assert KEY in r.json()["error"]["message"] and other in r.json()["error"]["message"]
    assert client.get(f"/v1/plans/{other}").status_code == 404
    assert client.get(f"/v1/plans/{KEY}").status_code == 404


def _bad_op(doc: dict[str, Any]) -> None:
    doc["forward"]["nodes"][0]["op"] = "builtins.eval"


@pytest.mark.parametrize("spoil, reason", [
    (lambda d: d.update(inputs=2), "the forward takes 1 inputs, not 2"),
    (lambda d: d.update(extra=1), "unknown fields ['extra']"),
    (_bad_op, "op 'builtins.eval' is not allowed"),
    (lambda d: d.update(kind="training"), "a training plan needs its backward"),
    (lambda d: d.update(outputs=[]), "an inference plan has no backward and returns exactly"),
])
def test_a_malformed_plan_is_refused_naming_why(client: TestClient, spoil: Any, reason: str) -> None:
    doc = plan_doc()
    spoil(doc)
    r = client.put(f"/v1/plans/{KEY}", json=doc)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_plan" and reason in error["message"], error
    assert client.get(f"/v1/plans/{KEY}").status_code == 404  # nothing stored


def test_a_body_that_is_not_json_is_refused(client: TestClient) -> None:
    r = client.put(f"/v1/plans/{KEY}", content=b"\x80\x04pickle", headers=JSON)
    assert r.status_code == 422 and "pickles and binary bodies are refused" in r.text
    r = client.put(f"/v1/plans/{KEY}", content=b"[1]", headers=JSON)
    assert r.status_code == 422 and r.json()["error"]["message"] == "a plan is a JSON object"


def test_the_body_limit_is_max_plan_bytes(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    text = canonical(plan_doc())
    # Plans may be twice a graph's limit: with a graph limit of the plan's own size, a body
    # of exactly twice that is read, one byte more is not.
    monkeypatch.setenv("KILN_MAX_BODY_BYTES", str(len(text)))
    limit = 2 * len(text)
    fits = text + " " * (limit - len(text))
    assert client.put(f"/v1/plans/{KEY}", content=fits, headers=JSON).status_code == 201
    other = "cd" * 32
    past = canonical(plan_doc(other)) + " " * (limit - len(text) + 1)
    assert len(past) == limit + 1
    r = client.put(f"/v1/plans/{other}", content=past, headers=JSON)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    assert str(limit) in r.json()["error"]["message"]
    assert client.get(f"/v1/plans/{other}").status_code == 404


@pytest.mark.parametrize("bad", ["abc", "AB" * 32, "ab" * 31 + "zz", "ab" * 33])
def test_a_malformed_key_is_refused(client: TestClient, bad: str) -> None:
    for r in (client.get(f"/v1/plans/{bad}"), client.put(f"/v1/plans/{bad}", json=plan_doc())):
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_key", r.text


def test_an_unknown_plan_is_404(client: TestClient) -> None:
    r = client.get(f"/v1/plans/{'ef' * 32}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_off_loopback_plans_need_a_token(pg_ctx: ServiceContext) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update={
        "host": "0.0.0.0", "admin_token": "kiln_a-long-random-admin-token-0123456789"})
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        for r in (c.put(f"/v1/plans/{KEY}", json=plan_doc()), c.get(f"/v1/plans/{KEY}")):
            assert r.status_code == 401 and "token" in r.json()["error"]["message"]
        bad = {"Authorization": "Bearer nope"}
        assert c.put(f"/v1/plans/{KEY}", json=plan_doc(), headers=bad).status_code == 401
        with pg_ctx.transaction() as session:
            token = {"Authorization": f"Bearer {create_token(session, 'client')}"}
        assert c.put(f"/v1/plans/{KEY}", json=plan_doc(), headers=token).status_code == 201
        assert c.get(f"/v1/plans/{KEY}", headers=token).status_code == 200


def test_an_admin_invalidates_a_plan(client: TestClient, pg_ctx: ServiceContext) -> None:
    path = f"/v1/admin/plans/{KEY}/invalidate"
    assert client.put(f"/v1/plans/{KEY}", json=plan_doc()).status_code == 201
    assert client.post(path).status_code == 401
    with pg_ctx.transaction() as session:
        token = create_token(session, "client")
    refused = client.post(path, headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 403 and client.get(f"/v1/plans/{KEY}").status_code == 200

    r = client.post(path, headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"key": KEY, "invalidated": True, "deleted": 1}
    assert client.get(f"/v1/plans/{KEY}").status_code == 404
    assert client.post(path, headers=ADMIN).json()["error"]["code"] == "not_found"
    assert client.post("/v1/admin/plans/xyz/invalidate", headers=ADMIN).status_code == 404
    # The key is free again: the next client's plan is stored.
    assert client.put(f"/v1/plans/{KEY}", json=plan_doc(scale=3.0)).status_code == 201
    assert client.get(f"/v1/plans/{KEY}").text == canonical(plan_doc(scale=3.0))


def test_stats_count_plans(any_client: TestClient) -> None:
    assert any_client.get("/v1/admin/stats", headers=ADMIN).json()["plans"] == 0
    for key in (KEY, "cd" * 32):
        assert any_client.put(f"/v1/plans/{key}", json=plan_doc(key)).status_code == 201
    any_client.put(f"/v1/plans/{KEY}", json=plan_doc())  # known: not counted twice
    assert any_client.get("/v1/admin/stats", headers=ADMIN).json()["plans"] == 2


def _counter(client: TestClient, name: str, label: str) -> float:
    match = re.search(rf'^{name}{{{label}}} (\S+)$', client.get("/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def test_metrics_count_plan_fetches_and_stores(client: TestClient) -> None:
    names = [("kiln_plan_lookups_total", 'outcome="hit"'), ("kiln_plan_lookups_total", 'outcome="miss"'),
             ("kiln_plan_stores_total", 'result="created"'), ("kiln_plan_stores_total", 'result="known"')]
    before = [_counter(client, *n) for n in names]
    client.get(f"/v1/plans/{KEY}")
    client.put(f"/v1/plans/{KEY}", json=plan_doc())
    client.put(f"/v1/plans/{KEY}", json=plan_doc())
    for _ in range(2):
        client.get(f"/v1/plans/{KEY}")
    after = [_counter(client, *n) for n in names]
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 1, 1, 1]


def test_openapi_describes_the_plan_body_and_answers(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    put = schema["paths"]["/v1/plans/{key}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["format"]["enum"] == ["kiln.plan/1"] and "forward" in body["required"]
    for status in ("200", "201"):
        answer = put["responses"][status]["content"]["application/json"]["schema"]
        assert answer == {"$ref": "#/components/schemas/PlanStored"}
    get = schema["paths"]["/v1/plans/{key}"]["get"]
    assert get["security"] == [{"bearer": []}, {}]
    assert get["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["kind"]


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0007_adds_and_drops_the_plans_table(backend: str, request: pytest.FixtureRequest,
                                                       tmp_path: Path) -> None:
    from alembic import command

    url = request.getfixturevalue("postgres_url") if backend == "postgresql" \
        else f"sqlite:///{tmp_path / 'k.db'}"
    upgrade(url, "0006")
    assert "plans" not in _tables(url) and "kernel_binaries" in _tables(url)
    upgrade(url, "0007")
    engine = create_engine(url)
    try:
        columns = {c["name"]: c for c in inspect(engine).get_columns("plans")}
        assert inspect(engine).get_pk_constraint("plans")["constrained_columns"] == ["key"]
    finally:
        engine.dispose()
    assert set(columns) == {"key", "kind", "body", "bytes", "created_at", "hits", "last_hit_at"}
    assert [n for n, c in columns.items() if c["nullable"]] == ["last_hit_at"]
    command.downgrade(alembic_config(url), "0006")
    assert "plans" not in _tables(url) and "kernel_binaries" in _tables(url)
    upgrade(url, "0007")  # and back up again
    assert "plans" in _tables(url)


def test_the_stored_body_is_the_canonical_text_not_the_one_sent(client: TestClient) -> None:
    doc = plan_doc()
    sent = json.dumps(dict(reversed(list(doc.items()))), indent=2)
    assert sent != canonical(doc)
    assert client.put(f"/v1/plans/{KEY}", content=sent, headers=JSON).status_code == 201
    assert client.get(f"/v1/plans/{KEY}").text == canonical(doc)
