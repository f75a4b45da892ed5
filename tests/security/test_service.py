"""Client data against the service: the HTTP API, SQL (LIKE patterns), the dashboard's HTML,
redirect headers and cookies. Runs the real app in-process on a fresh PostgreSQL database."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

import compiler
from tests.security.conftest import PAYLOAD, graph, node, relu_graph

pytestmark = pytest.mark.services

ADMIN = "kiln_security-test-admin-token"
SCRIPT_TAG = "<script>alert('tag')</script>"
IMG_NAME = '"><img src=x onerror=alert(1)>'  # printable ASCII: a valid device name


@pytest.fixture
def client(postgres_url: str) -> Iterator[TestClient]:
    from service.api.app import create_app
    from service.context import ServiceContext
    from service.migrate import upgrade
    from service.queue import InProcessQueue
    from service.settings import Settings

    upgrade(postgres_url)
    settings = Settings(database_url=postgres_url, admin_token=ADMIN, rate_limit_per_s=0)
    ctx = ServiceContext(settings, queue=InProcessQueue(settings.lease_s))
    try:
        with TestClient(create_app(ctx=ctx), base_url="http://127.0.0.1",
                        follow_redirects=False) as c:
            c.app_ctx = ctx  # type: ignore[attr-defined]
            yield c
    finally:
        ctx.close()


def _submit(client: TestClient, doc: dict[str, Any], tag: str | None = None,
            target: dict[str, str] | None = None) -> Any:
    body: dict[str, Any] = {"graph": doc, "target": target or compiler.Target.cpu().to_json()}
    if tag is not None:
        body["tag"] = tag
    return client.post("/v1/graphs", content=json.dumps(body),
                       headers={"content-type": "application/json"})


def _login(client: TestClient) -> None:
    page = client.get("/admin/login")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    response = client.post("/admin/login", data={"token": ADMIN, "csrf_token": csrf, "next": "/admin"})
    assert response.status_code == 303, response.text


def _assert_inert(html: str, *texts: str) -> None:
    for text in texts:
        assert text not in html, f"raw {text!r} in the page"
    assert "<script>alert" not in html and "<img src=x" not in html


# --- API: graphs, keys, bodies -----------------------------------------------------------


def test_graph_injections_are_refused_with_422(client: TestClient) -> None:
    hostile = relu_graph()
    hostile["nodes"][0]["name"] = PAYLOAD
    hostile["outputs"] = [{"ref": PAYLOAD}]
    for doc in (hostile,
                graph([node("y", "aten.div.Tensor_mode", [{"ref": "x"}, {"ref": "x"}],
                            {"rounding_mode": PAYLOAD})]),
                graph([node("y", "aten.uniform.default", [{"ref": "x"}], {"from": 0.0})])):
        response = _submit(client, doc)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_graph"


@pytest.mark.slow
def test_repeated_keys_and_bare_nan_in_the_body_are_refused(client: TestClient) -> None:
    target = json.dumps(compiler.Target.cpu().to_json())
    text = json.dumps(relu_graph())
    # A repeated key: a proxy (or a reviewer) sees the first op, json.loads keeps the last.
    doubled = text.replace('"op": "aten.relu.default"',
                           '"op": "aten.relu.default", "op": "aten.neg.default"')
    assert doubled != text
    for body in (f'{{"graph": {doubled}, "target": {target}}}',
                 f'{{"graph": {text}, "graph": {text}, "target": {target}}}',
                 f'{{"graph": {text}, "target": {target}, "tag": NaN}}'):
        response = client.post("/v1/graphs", content=body,
                               headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_json"


@pytest.mark.slow
def test_tags_must_be_printable(client: TestClient) -> None:
    for tag in ("a\nb", "x\x1b[31m", "nul\x00", "rtl\u202etxt.exe", "a" * 201, 7):
        response = _submit(client, relu_graph(), tag=tag)  # type: ignore[arg-type]
        assert response.status_code == 422, (tag, response.text)
        assert response.json()["error"]["code"] == "invalid_request"
    assert _submit(client, relu_graph(), tag="gpt-2 small / été").status_code == 202


@pytest.mark.slow
def test_keys_with_a_trailing_newline_are_refused(client: TestClient) -> None:
    response = _submit(client, relu_graph())
    assert response.status_code == 202, response.text
    key = response.json()["key"]
    response = client.get(f"/v1/schedules/{key}%0A")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_key"
    _login(client)
    response = client.get(f"/v1/admin/entries/{key}%0A")
    assert response.status_code == 404
    assert "\n" not in response.json()["error"]["message"]


# --- SQL ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_admin_search_is_parameterised_and_like_wildcards_are_literal(client: TestClient) -> None:
    keys = [_submit(client, relu_graph(), tag="t1").json()["key"],
            _submit(client, graph([node("y", "aten.neg.default", [{"ref": "x"}])])).json()["key"]]
    _login(client)

    def total(**params: str) -> int:
        response = client.get("/v1/admin/entries", params=params)
        assert response.status_code == 200, response.text
        return response.json()["total"]

    assert total() == 2 and total(q=keys[0][:6]) == 1
    for q in ("%", "_", "%%", "\\", "\\%", keys[0][:3] + "%", "_" * 8, "' OR '1'='1", "'; DROP TABLE schedules; --"):
        assert total(q=q) == 0, q
    for value in ("' OR '1'='1", "%", "t%", "t_"):
        assert total(tag=value) == 0, value
        assert total(target=value) == 0, value
    assert total(tag="t1") == 1
    # the tables are still there
    assert total() == 2


# --- dashboard HTML -----------------------------------------------------------------------


def test_client_text_is_escaped_on_every_dashboard_page(client: TestClient) -> None:
    target = compiler.Target.named("sm_90", name=IMG_NAME).to_json()
    response = _submit(client, relu_graph(), tag=SCRIPT_TAG, target=target)
    assert response.status_code == 202, response.text
    key = response.json()["key"]
    # A job error and history message holding markup (ops may echo client strings).
    from service import store
    from service.models import JobRow

    with client.app_ctx.transaction() as session:  # type: ignore[attr-defined]
        job = session.scalars(select(JobRow).where(JobRow.key == key)).one()
        session.execute(update(JobRow).where(JobRow.id == job.id).values(
            status="failed", error=f"RuntimeError: {SCRIPT_TAG}"))
        store.add_event(session, job, "failed", IMG_NAME, SCRIPT_TAG)
    _login(client)
    pages = {
        "entries": client.get("/admin/entries"),
        "entries filtered": client.get("/admin/entries", params={"tag": SCRIPT_TAG, "target": IMG_NAME}),
        "entry": client.get(f"/admin/entries/{key}"),
        "jobs": client.get("/admin/jobs"),
        "overview": client.get("/admin"),
        "missing entry": client.get("/admin/entries/%3Cimg%20src%3Dx%20onerror%3Dalert('k')%3E"),
    }
    for label, page in pages.items():
        assert page.status_code in (200, 404), (label, page.status_code)
        assert "text/html" in page.headers["content-type"], label
        assert "script-src 'self'" in page.headers["content-security-policy"]
        _assert_inert(page.text, SCRIPT_TAG, IMG_NAME, "onerror=alert('k')>")
    assert "&lt;script&gt;alert(&#39;tag&#39;)&lt;/script&gt;" in pages["entry"].text
    assert "&lt;img src=x onerror=alert(1)&gt;" in pages["entry"].text
    assert "&lt;script&gt;" in pages["jobs"].text
    assert "&lt;img src=x onerror=alert(&#39;k&#39;)&gt;" in pages["missing entry"].text
    assert f'value="{SCRIPT_TAG}"' not in pages["entries filtered"].text


@pytest.mark.slow
def test_admin_cookie_alone_cannot_change_state_through_the_json_api(client: TestClient) -> None:
    # A form on any same-site page (another port of the host, a sibling subdomain) posts with
    # the SameSite=Strict cookie attached; the JSON admin API has no CSRF token to check.
    key = _submit(client, relu_graph()).json()["key"]
    _login(client)
    assert client.get(f"/v1/admin/entries/{key}").status_code == 200  # reads are fine
    for action in ("invalidate", "retune"):
        response = client.post(f"/v1/admin/entries/{key}/{action}",
                               headers={"content-type": "application/x-www-form-urlencoded"})
        assert response.status_code == 403, response.text
    assert client.get(f"/v1/admin/entries/{key}").json()["status"] != "invalidated"
    response = client.post(f"/v1/admin/entries/{key}/invalidate",
                           headers={"Authorization": f"Bearer {ADMIN}"})
    assert response.status_code == 200 and response.json()["status"] == "invalidated"


@pytest.mark.slow
def test_login_next_cannot_inject_headers_or_leave_the_dashboard(client: TestClient) -> None:
    for next_ in ("/admin\r\nSet-Cookie: evil=1", "//evil.example/admin", "https://evil.example/admin",
                  "/admin\\@evil.example", "javascript:alert(1)//admin", "/admin/\"><script>x</script>"):
        client.cookies.clear()
        page = client.get("/admin/login", params={"next": next_})
        _assert_inert(page.text, "<script>x</script>")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        response = client.post("/admin/login", data={"token": ADMIN, "csrf_token": csrf, "next": next_})
        assert response.status_code == 303
        location = response.headers["location"]
        assert location.startswith("/admin") and not location.startswith("//"), location
        assert "\r" not in location and "\n" not in location and "<" not in location
        assert "evil" not in response.headers.get("set-cookie", "")
        cookie = [c for c in response.headers.get_list("set-cookie") if c.startswith("kiln_admin=")]
        assert cookie and "httponly" in cookie[0].lower() and "samesite=strict" in cookie[0].lower()
