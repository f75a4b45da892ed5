"""The dashboard's Plans page: plans listed by tenant, and its Publish-to-all form (CSRF and
confirmation as the other dashboard actions). Runs the real app on PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.context import ServiceContext
from service.store import plans
from tests.dashboard.conftest import ADMIN_TOKEN

# slow: each test starts the app, whose intake fork server imports torch and Triton (~4 s).
pytestmark = [pytest.mark.services, pytest.mark.slow]

KEY_A, KEY_B = "a1" * 32, "b2" * 32


def _csrf(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


@pytest.fixture
def admin(dash_ctx: ServiceContext) -> Iterator[tuple[TestClient, ServiceContext]]:
    with TestClient(create_app(ctx=dash_ctx), base_url="http://127.0.0.1",
                    follow_redirects=False) as client:
        client.post("/admin/login", data={"token": ADMIN_TOKEN, "next": "/admin",
                                          "csrf_token": _csrf(client.get("/admin/login").text)})
        with dash_ctx.transaction() as session:
            plans.put_plan(session, KEY_A, "team-a", "inference", '{"from":"a"}')
            plans.put_plan(session, KEY_A, "team-b", "inference", '{"from":"b"}')
            plans.put_plan(session, KEY_B, "team-b", "training", '{"from":"b2"}')
        yield client, dash_ctx


def _published(ctx: ServiceContext) -> list[tuple[str, str | None]]:
    with ctx.transaction() as session:
        return [(p["key"], p["published_from"]) for p in plans.list_plans(session, tenant="*")]


def test_plans_are_listed_by_tenant_with_a_publish_form_each(admin) -> None:
    client, _ctx = admin
    page = client.get("/admin/plans")
    assert page.status_code == 200
    html = page.text
    assert 'href="/admin/plans" aria-current="page"' in html
    a, b = html.index('id="tenant-team-a"'), html.index('id="tenant-team-b"')
    assert a < b
    assert html[a:b].count("Publish to all") == 1 and html[b:].count("Publish to all") == 2
    forms = re.findall(r'<form method="post" action="/admin/plans/([0-9a-f]{64})/publish".*?'
                       r'name="tenant" value="([^"]+)"', html, re.S)
    assert sorted(forms) == sorted([(KEY_A, "team-a"), (KEY_A, "team-b"), (KEY_B, "team-b")])


def test_publish_to_all_needs_the_csrf_token_and_a_confirmation(admin) -> None:
    client, ctx = admin
    csrf = _csrf(client.get("/admin/plans").text)
    url = f"/admin/plans/{KEY_A}/publish"
    forged = client.post(url, data={"tenant": "team-a", "confirmed": "yes", "csrf_token": "x"})
    assert forged.status_code == 403 and _published(ctx) == []
    asked = client.post(url, data={"tenant": "team-a", "csrf_token": csrf})
    assert asked.status_code == 200 and "Publish this plan?" in asked.text
    assert 'name="tenant" value="team-a"' in asked.text and _published(ctx) == []
    done = client.post(url, data={"tenant": "team-a", "csrf_token": csrf, "confirmed": "yes"})
    assert done.status_code == 303 and done.headers["location"] == "/admin/plans?done=publish"
    assert _published(ctx) == [(KEY_A, "team-a")]
    html = client.get("/admin/plans?done=publish").text
    assert "Plan published to every tenant." in html
    published = html[html.index("Published to all"):html.index('id="tenant-team-a"')]
    assert KEY_A[:16] in published and "team-a" in published
    # Team B's plan of the same key can no longer be published; the page says why.
    assert "another tenant's plan is published" in html
    clash = client.post(url, data={"tenant": "team-b", "csrf_token": csrf, "confirmed": "yes"})
    assert clash.status_code == 409 and _published(ctx) == [(KEY_A, "team-a")]
    missing = client.post(f"/admin/plans/{KEY_B}/publish",
                          data={"tenant": "team-a", "csrf_token": csrf, "confirmed": "yes"})
    assert missing.status_code == 404


def test_the_plans_page_and_publishing_need_an_admin_session(dash_ctx: ServiceContext) -> None:
    with TestClient(create_app(ctx=dash_ctx), base_url="http://127.0.0.1",
                    follow_redirects=False) as client:
        with dash_ctx.transaction() as session:
            plans.put_plan(session, KEY_A, "team-a", "inference", '{"from":"a"}')
        assert client.get("/admin/plans").status_code == 303
        posted = client.post(f"/admin/plans/{KEY_A}/publish",
                             data={"tenant": "team-a", "confirmed": "yes"})
        assert posted.status_code == 303 and "/admin/login" in posted.headers["location"]
        assert _published(dash_ctx) == []
