"""A web page cannot use a loopback kiln: rebound Host names, cross-site simple POSTs and
foreign Origins are refused before any route runs (service/api/loopback.py)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.loopback import refusal
from service.context import ServiceContext
from service.models import JobRow
from tests.service.helpers import wire_body

# slow: each test starts the app, whose intake fork server imports torch and Triton (~4 s).
pytestmark = [pytest.mark.services, pytest.mark.slow]

KEY = "c" * 64


def _jobs(ctx: ServiceContext) -> int:
    with ctx.transaction() as session:
        return session.query(JobRow).count()


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "10.0.0.5",
                                  "127.0.0.1.attacker.example", ""])
def test_a_rebound_host_name_is_refused_on_loopback(client: TestClient, pg_ctx: ServiceContext,
                                                    host: str) -> None:
    # DNS rebinding: the page's own name now resolves to 127.0.0.1 and arrives as Host.
    read = client.get(f"/v1/schedules/{KEY}", headers={"Host": host})
    assert read.status_code == 421 and read.json()["error"]["code"] == "host_not_allowed"
    post = client.post("/v1/graphs", json=wire_body(), headers={"Host": host})
    assert post.status_code == 421
    assert client.get("/admin/login", headers={"Host": host}).status_code == 421
    assert _jobs(pg_ctx) == 0


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "localhost:8000", "LOCALHOST",
                                  "[::1]:8000", "[::1]"])
def test_loopback_names_are_served(client: TestClient, host: str) -> None:
    assert client.get(f"/v1/schedules/{KEY}", headers={"Host": host}).status_code == 404


def test_any_host_reaches_a_public_bind_where_tokens_are_required(pg_ctx: ServiceContext) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update={
        "host": "0.0.0.0", "admin_token": "kiln_a-long-random-admin-token-0123456789"})
    with TestClient(create_app(ctx=pg_ctx), base_url="http://kiln.example") as c:
        assert c.get(f"/v1/schedules/{KEY}").status_code == 401


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_a_cross_site_simple_post_is_refused(client: TestClient, pg_ctx: ServiceContext,
                                             content_type: str | None) -> None:
    # What a form or `fetch(..., {mode: "no-cors"})` of another site can send without a
    # preflight: a JSON document under a "simple" content type. Never read as a graph.
    headers = {"content-type": content_type} if content_type else {}
    client.headers.pop("content-type", None)
    r = client.post("/v1/graphs", content=json.dumps(wire_body()).encode(), headers=headers)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert _jobs(pg_ctx) == 0


@pytest.mark.parametrize("headers", [{"Origin": "http://attacker.example"},
                                     {"Origin": "http://127.0.0.1:9999"},  # another port
                                     {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"},
                                     {"Sec-Fetch-Site": "same-site"}])
def test_state_changes_from_another_origin_are_refused(client: TestClient, pg_ctx: ServiceContext,
                                                       headers: dict[str, str]) -> None:
    r = client.post("/v1/graphs", json=wire_body(), headers=headers)
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"
    login = client.post("/admin/login", data={"token": "x", "csrf_token": "y"}, headers=headers)
    assert login.status_code == 403
    assert _jobs(pg_ctx) == 0
    # Reads are not state changes: a foreign page cannot read the answer anyway (no CORS).
    assert client.get(f"/v1/schedules/{KEY}", headers=headers).status_code == 404


def test_same_origin_and_non_browser_posts_go_through(client: TestClient) -> None:
    same = client.post("/v1/graphs", json=wire_body(),
                       headers={"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 202, same.text
    plain = client.post("/v1/graphs", json=wire_body(),
                        headers={"content-type": "application/json; charset=utf-8"})
    assert plain.status_code == 202


def test_refusal_rules_without_a_server() -> None:
    ok = {"host": "127.0.0.1:8000", "content-type": "application/json", "content-length": "2"}
    assert refusal("POST", "/v1/graphs", ok, loopback=True) is None
    assert refusal("POST", "/v1/graphs", {**ok, "content-type": "application/problem+json"},
                   loopback=True) is None
    assert refusal("POST", "/v1/graphs", {**ok, "host": "[::1]"}, loopback=True) is None
    assert refusal("GET", "/", {"host": "evil"}, loopback=True)[0] == 421
    assert refusal("GET", "/", {"host": "evil"}, loopback=False) is None
    # A bodiless POST (admin actions) needs no content type; the Origin check still applies.
    bodiless = {"host": "127.0.0.1:8000"}
    assert refusal("POST", "/v1/admin/entries/k/retune", bodiless, loopback=True) is None
    assert refusal("POST", "/v1/admin/entries/k/retune",
                   {**bodiless, "origin": "http://evil"}, loopback=True)[0] == 403
