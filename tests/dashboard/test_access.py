"""Who sees what: login, the session cookie, CSRF, and that no data leaks without the token.

Runs the real service app (PostgreSQL, the service's token check) in-process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service import auth
from service.api.app import create_app
from service.context import ServiceContext
from service.models import TokenRow
from tests.dashboard.conftest import ADMIN_TOKEN, seed_entry

# slow: each test starts the app, whose intake fork server imports torch and Triton (~4 s);
# test_operator_pages keeps the dashboard's pages in `make test`.
pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def app_ctx(dash_ctx: ServiceContext) -> Iterator[tuple[TestClient, ServiceContext, str]]:
    key = seed_entry(dash_ctx)
    with TestClient(create_app(ctx=dash_ctx), base_url="http://127.0.0.1",
                    follow_redirects=False) as client:
        yield client, dash_ctx, key


def _csrf(client: TestClient, path: str = "/admin/login") -> str:
    page = client.get(path)
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, page.text[:500]
    return match.group(1)


def _login(client: TestClient, token: str = ADMIN_TOKEN, next_: str = "/admin"):
    return client.post("/admin/login", data={"token": token, "csrf_token": _csrf(client),
                                             "next": next_})


def test_pages_without_token_redirect_to_login_and_show_no_data(app_ctx) -> None:
    client, _, key = app_ctx
    for path in ("/admin", "/admin/entries", f"/admin/entries/{key}", "/admin/jobs",
                 f"/admin/entries?q={key[:6]}"):
        response = client.get(path)
        assert response.status_code == 303, path
        assert response.headers["location"].startswith("/admin/login?next=")
        assert key[:12] not in response.text
    for path in (f"/admin/entries/{key}/invalidate", f"/admin/entries/{key}/retune"):
        response = client.post(path, data={"confirmed": "yes"})
        assert response.status_code == 303 and "/admin/login" in response.headers["location"]
    # The admin JSON API answers 401 with an error body, never data.
    response = client.get("/v1/admin/entries")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert key not in response.text
    # A wrong token in the cookie is no better than none.
    client.cookies.set("kiln_admin", "kiln_not-a-token")
    assert client.get(f"/admin/entries/{key}").status_code == 303
    assert client.get("/v1/admin/stats").status_code == 401


def test_login_sets_a_strict_httponly_cookie_and_keeps_the_token_out_of_urls(app_ctx) -> None:
    client, _, key = app_ctx
    response = _login(client, next_=f"/admin/entries/{key}")
    assert response.status_code == 303
    assert response.headers["location"] == f"/admin/entries/{key}"
    assert ADMIN_TOKEN not in response.headers["location"]
    cookie = next(h for h in response.headers.get_list("set-cookie") if h.startswith("kiln_admin="))
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "samesite", "path"} <= attributes
    assert "samesite=strict" in cookie.lower() and "secure" not in attributes  # plain http
    page = client.get(f"/admin/entries/{key}")
    assert page.status_code == 200 and key in page.text
    assert ADMIN_TOKEN not in page.text
    # The same cookie opens the admin API (the contract: bearer header or the cookie).
    assert client.get("/v1/admin/entries").json()["total"] == 1


def test_cookie_is_secure_over_https(dash_ctx: ServiceContext) -> None:
    with TestClient(create_app(ctx=dash_ctx), base_url="https://localhost",
                    follow_redirects=False) as client:
        response = _login(client)
    cookie = next(h for h in response.headers.get_list("set-cookie") if h.startswith("kiln_admin="))
    assert "secure" in {p.strip().lower() for p in cookie.split(";")}


def test_wrong_token_client_token_and_missing_csrf_are_refused(app_ctx) -> None:
    client, ctx, _ = app_ctx
    response = _login(client, token="kiln_wrong")
    assert response.status_code == 401 and "not an admin token" in response.text
    assert "kiln_admin" not in response.headers.get("set-cookie", "")
    with ctx.transaction() as session:
        client_token = auth.create_token(session, "client")
    assert _login(client, token=client_token).status_code == 401
    client.cookies.set("kiln_admin", client_token)  # a client token planted in the cookie
    assert client.get("/admin").status_code == 303
    assert client.get("/v1/admin/entries").status_code == 401
    client.cookies.delete("kiln_admin")
    response = client.post("/admin/login", data={"token": ADMIN_TOKEN, "csrf_token": "forged"})
    assert response.status_code == 403
    assert "kiln_admin" not in response.headers.get("set-cookie", "")


def test_stored_admin_token_logs_in_and_logout_forgets_it(app_ctx) -> None:
    client, ctx, _ = app_ctx
    with ctx.transaction() as session:
        token = auth.create_token(session, "admin", name="operator")
    assert _login(client, token=token).status_code == 303
    assert client.get("/admin").status_code == 200
    response = client.post("/admin/logout", data={"csrf_token": _csrf(client, "/admin")})
    assert response.status_code == 303
    assert client.get("/admin").status_code == 303


def test_open_redirects_after_login_are_refused(app_ctx) -> None:
    client, _, _ = app_ctx
    for target in ("https://evil.example/admin", "//evil.example/admin", "/v1/admin/entries"):
        client.cookies.delete("kiln_admin")
        response = _login(client, next_=target)
        assert response.headers["location"] == "/admin", target


def test_actions_need_csrf_and_confirmation(app_ctx) -> None:
    client, _, key = app_ctx
    _login(client)
    response = client.post(f"/admin/entries/{key}/invalidate",
                           data={"csrf_token": "forged", "confirmed": "yes"})
    assert response.status_code == 403
    assert client.get(f"/v1/schedules/{key}").status_code == 200  # untouched
    csrf = _csrf(client, f"/admin/entries/{key}")
    response = client.post(f"/admin/entries/{key}/invalidate", data={"csrf_token": csrf})
    assert response.status_code == 200 and "Yes, invalidate" in response.text  # asks first
    assert client.get(f"/v1/schedules/{key}").status_code == 200
    response = client.post(f"/admin/entries/{key}/invalidate",
                           data={"csrf_token": csrf, "confirmed": "yes"})
    assert response.status_code == 303
    answer = client.get(f"/v1/schedules/{key}")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "invalidated"


def test_bad_keys_and_filters_get_clear_answers(app_ctx) -> None:
    client, _, key = app_ctx
    _login(client)
    assert client.get("/admin/entries/not-a-key").status_code == 404
    assert client.get("/admin/entries/" + "0" * 64).status_code == 404
    page = client.get("/admin/entries?q=zz%25&status=bogus&sort=drop&order=x&page=-3")
    assert page.status_code == 200 and "hexadecimal" in page.text
    assert key[:12] in page.text  # the bad filters were dropped, not applied
    assert client.get("/admin/static/../../settings.py").status_code == 404


def test_entries_sort_by_tuning_time_and_filter_by_tag(app_ctx) -> None:
    client, ctx, first = app_ctx
    slow = seed_entry(ctx, tag="slow-model", tuning_s=900.0)
    quick = seed_entry(ctx, tag="quick-model", tuning_s=30.0)
    _login(client)
    page = client.get("/admin/entries?sort=tuning_s&order=desc").text
    assert page.index(slow[:12]) < page.index(quick[:12]) < page.index(first[:12])
    page = client.get("/admin/entries?sort=tuning_s&order=asc").text
    assert page.index(quick[:12]) < page.index(slow[:12])
    page = client.get("/admin/entries?tag=quick-model").text
    assert quick[:12] in page and slow[:12] not in page and first[:12] not in page


def test_entries_are_paged(app_ctx) -> None:
    client, ctx, _ = app_ctx
    for _ in range(10):
        seed_entry(ctx, tag="paged")
    _login(client)
    first = client.get("/admin/entries?tag=paged&per_page=10&order=asc")
    assert first.status_code == 200 and "page 1 of 1" not in first.text
    assert "11 entries" not in first.text and "10 entries" in first.text
    seed_entry(ctx, tag="paged")
    first = client.get("/admin/entries?tag=paged&per_page=10")
    assert "11 entries, page 1 of 2" in first.text
    link = re.search(r'href="(/admin/entries\?[^"]*page=2[^"]*)" rel="next"', first.text)
    assert link, first.text[-1500:]
    second = client.get(link.group(1).replace("&amp;", "&"))
    assert second.status_code == 200 and "page 2 of 2" in second.text
    assert second.text.count('<tr>') - 1 == 1  # the 11th entry, below the header row


def test_a_revoked_admin_token_loses_the_dashboard_at_once(app_ctx) -> None:
    client, ctx, key = app_ctx
    with ctx.transaction() as session:
        token = auth.create_token(session, "admin")
    _login(client, token=token)
    assert client.get(f"/admin/entries/{key}").status_code == 200
    with ctx.transaction() as session:
        session.execute(update(TokenRow).where(TokenRow.token_hash == auth.hash_token(token))
                        .values(revoked=True))
    response = client.get(f"/admin/entries/{key}")
    assert response.status_code == 303 and key[:12] not in response.text


def test_retune_from_the_entry_page_queues_a_job(app_ctx) -> None:
    client, _, key = app_ctx
    _login(client)
    page = client.get(f"/admin/entries/{key}")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    response = client.post(f"/admin/entries/{key}/retune",
                           data={"csrf_token": csrf, "confirmed": "yes"})
    assert response.status_code == 303
    assert client.get(response.headers["location"]).text.count("Re-tune queued") == 1
    jobs = client.get("/v1/admin/jobs").json()["items"]
    (job,) = [j for j in jobs if j["key"] == key]
    assert job["status"] == "queued"
    assert any("re-tune requested" in (h.get("message") or "") for h in job["history"])


def test_wrong_logins_never_lock_out_the_right_token(app_ctx) -> None:
    client, _, _ = app_ctx
    # The outside tester's case, at the default limits: 20+ wrong logins from one address.
    assert [_login(client, token=f"kiln_guess{i}").status_code for i in range(25)] == [401] * 25
    response = _login(client)
    assert response.status_code == 303 and "kiln_admin" in response.headers["set-cookie"]


def test_repeated_wrong_logins_back_off_but_the_right_token_logs_in(app_ctx) -> None:
    from service.ratelimit import AuthFailures, FailureThrottle

    client, _, _ = app_ctx
    client.app.state.auth_failures = AuthFailures(FailureThrottle(limit=3),
                                                  FailureThrottle(limit=5))
    # One wrong token again and again: refused with backoff after its third try.
    assert [_login(client, token="kiln_typo").status_code for _ in range(4)] == [401, 401, 429, 429]
    # Wrong tokens from the address: past its limit, 429 with Retry-After.
    codes = [_login(client, token=f"kiln_guess{i}") for i in range(2)]
    assert [r.status_code for r in codes] == [401, 429]
    assert int(codes[-1].headers["retry-after"]) >= 1
    assert "kiln_admin" not in codes[-1].headers.get("set-cookie", "")
    response = _login(client)  # the right token passes the address's lockout
    assert response.status_code == 303 and "kiln_admin" in response.headers["set-cookie"]


def test_the_cookie_holds_a_session_id_that_logout_revokes(app_ctx) -> None:
    client, _, key = app_ctx
    assert _login(client).status_code == 303
    sid = client.cookies.get("kiln_admin")
    assert sid and ADMIN_TOKEN not in sid and sid != auth.hash_token(ADMIN_TOKEN)
    assert client.post("/admin/logout", data={"csrf_token": _csrf(client, "/admin")}
                       ).status_code == 303
    # A copy of the cookie taken before logout (another tab, a stolen cookie) is dead too.
    client.cookies.set("kiln_admin", sid)
    assert client.get(f"/admin/entries/{key}").status_code == 303
    assert client.get("/v1/admin/entries").status_code == 401


def test_revoking_the_admin_token_ends_its_sessions(app_ctx) -> None:
    client, ctx, _ = app_ctx
    with ctx.transaction() as session:
        token = auth.create_token(session, "admin", name="operator")
    _login(client, token=token)
    assert client.get("/admin").status_code == 200
    with ctx.transaction() as session:
        session.execute(update(TokenRow).where(TokenRow.token_hash == auth.hash_token(token))
                        .values(revoked=True))
    assert client.get("/admin").status_code == 303


def test_an_expired_session_is_refused(app_ctx) -> None:
    client, ctx, _ = app_ctx
    with ctx.transaction() as session:
        sid = auth.create_session(session, ADMIN_TOKEN, ttl_s=-1)
    client.cookies.set("kiln_admin", sid)
    assert client.get("/admin").status_code == 303


def test_a_planted_csrf_cookie_does_not_pass_once_logged_in(app_ctx) -> None:
    # Another port of the same host can set cookies for this one; a CSRF value of its
    # choosing, planted and echoed, must not authorise an action in the operator's session.
    client, _, key = app_ctx
    _login(client)
    client.cookies.set("kiln_csrf", "planted-by-another-port-0123456789", path="/admin")
    response = client.post(f"/admin/entries/{key}/invalidate",
                           data={"csrf_token": "planted-by-another-port-0123456789",
                                 "confirmed": "yes"})
    assert response.status_code == 403
    assert client.get(f"/admin/entries/{key}").status_code == 200
