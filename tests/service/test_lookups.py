"""Schedule lookups (`GET /v1/schedules/{key}`) on the embedded default's SQLite: the ASGI
fast path answers exactly as the FastAPI route, settled answers are kept only
KILN_LOOKUP_CACHE_S, token grants only KILN_TOKEN_CACHE_S, a locked database is a 503."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service import store
from service.api.app import create_app
from service.api.fastpath import LookupFastPath
from service.auth import create_token
from service.context import ServiceContext
from service.migrate import upgrade
from service.models import JobRow
from service.settings import Settings
from service.store import tokens
from tests.service.helpers import fake_submission

SCHEDULE = {"format": "kiln.schedule/1", "kernels": []}
PUBLIC_ADMIN = "kiln_a-long-random-admin-token-0123456789"


@pytest.fixture
def sqlite_ctx(tmp_path: Path) -> Iterator[ServiceContext]:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    upgrade(url)
    ctx = ServiceContext(Settings(database_url=url, admin_token="admin-secret"))
    yield ctx
    ctx.close()


def _settings(ctx: ServiceContext, **update: Any) -> None:
    ctx.settings = ctx.settings.model_copy(update=update)


def _entry(ctx: ServiceContext, status: str = "pending", job_status: str = "queued",
           error: str | None = None) -> str:
    """A stored entry whose schedule is `status` and whose job is `job_status`."""
    with ctx.transaction() as session:
        row, job, _ = store.submit(session, fake_submission())
        key = row.key
        if status in ("heuristic", "tuned"):
            assert store.publish_schedule(session, key, status, SCHEDULE, [], {})
        elif status != "pending":
            store.set_entry_status(session, key, status, clear_schedule=True)
        session.execute(update(JobRow).where(JobRow.id == job.id)
                        .values(status=job_status, error=error))
    return key


def _without_fast_path(app: Any) -> Any:
    """The same app answering lookups through the FastAPI route only."""
    app.user_middleware = [m for m in app.user_middleware if m.cls is not LookupFastPath]
    return app


def _wire(response: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    return response.status_code, response.headers.multi_items(), response.content


def _timeless(wire: tuple[int, list[tuple[str, str]], bytes]) -> tuple:
    """A 429's body names the seconds until the bucket refills, which differ between two
    requests made a moment apart: compared without them."""
    status, headers, body = wire
    return status, headers, re.sub(rb"\d+\.\d+ s", b"<seconds> s", body) if status == 429 else body


def test_the_fast_path_answers_byte_for_byte_as_the_route(sqlite_ctx: ServiceContext) -> None:
    keys = {"hit": _entry(sqlite_ctx, "heuristic", "done"),
            "hit, tuning": _entry(sqlite_ctx, "heuristic", "running"),
            "tuned": _entry(sqlite_ctx, "tuned", "done"),
            "pending": _entry(sqlite_ctx),
            "invalidated": _entry(sqlite_ctx, "invalidated", "done"),
            "failed": _entry(sqlite_ctx, "failed", "failed", "lowering: no rule for aten.foo"),
            "unknown": "e" * 64, "malformed": "E" * 64, "newline": "e" * 64 + "%0A"}
    with TestClient(create_app(ctx=sqlite_ctx), base_url="http://127.0.0.1") as fast, \
            TestClient(_without_fast_path(create_app(ctx=sqlite_ctx)),
                       base_url="http://127.0.0.1") as route:
        for what, key in keys.items():
            answers = [_wire(c.get(f"/v1/schedules/{key}")) for c in (fast, route, fast)]
            assert answers[0] == answers[1] == answers[2], what  # the third: a kept answer
        assert _wire(fast.get(f"/v1/schedules/{keys['hit']}"))[0] == 200
        for c in (fast, route):
            c.app.state.hits.flush(sqlite_ctx)
    # Hits are counted either way: three through the fast path, one through the route.
    with sqlite_ctx.transaction() as session:
        assert store.schedule_by_key(session, keys["hit"]).hits == 4
        assert store.schedule_by_key(session, keys["pending"]).hits == 0


@pytest.mark.slow
def test_auth_and_limit_answers_are_the_routes(sqlite_ctx: ServiceContext) -> None:
    _settings(sqlite_ctx, host="0.0.0.0", admin_token=PUBLIC_ADMIN, rate_limit_per_s=1.0,
              rate_limit_burst=2)
    with sqlite_ctx.transaction() as session:
        token = create_token(session, "client")
    key = _entry(sqlite_ctx, "heuristic", "done")
    apps = create_app(ctx=sqlite_ctx), _without_fast_path(create_app(ctx=sqlite_ctx))
    with TestClient(apps[0], base_url="http://kiln.example") as fast, \
            TestClient(apps[1], base_url="http://kiln.example") as route:
        for headers in ({}, {"Authorization": "Basic x"}, {"Authorization": "Bearer kiln_nope"}):
            assert _wire(fast.get(f"/v1/schedules/{key}", headers=headers)) == \
                _wire(route.get(f"/v1/schedules/{key}", headers=headers))
        bearer = {"Authorization": f"Bearer {token}"}
        # The first request checks the token on the route, the next ones go by the kept grant;
        # the third is past the burst of 2.
        answers = [[_timeless(_wire(c.get(f"/v1/schedules/{key}", headers=bearer)))
                    for _ in range(3)] for c in (fast, route)]
        assert answers[0] == answers[1]
        assert [a[0] for a in answers[0]] == [200, 200, 429]


def test_the_fast_path_serves_lookups_and_passes_the_rest_on(sqlite_ctx: ServiceContext) -> None:
    app = create_app(ctx=sqlite_ctx)
    key = _entry(sqlite_ctx, "heuristic", "done")
    passed: list[str] = []

    async def inner(scope: dict, _receive: Any, send: Any) -> None:
        passed.append(scope["path"])
        await send({"type": "http.response.start", "status": 599, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    fast = LookupFastPath(inner)

    async def get(path: str, method: str = "GET", **headers: str) -> int:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "root_path": "", "app": app,
                 "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
                 "query_string": b"", "client": ("127.0.0.1", 4000)}
        await fast(scope, None, send)
        return sent[0]["status"]

    async def run() -> list[int]:
        return [await get(f"/v1/schedules/{key}"), await get(f"/v1/schedules/{'f' * 64}"),
                await get(f"/v1/schedules/{key}", Authorization="Bearer kiln_unchecked"),
                await get(f"/v1/schedules/{key}/x"), await get(f"/v1/schedules/{key}", "HEAD"),
                await get("/v1/schedules/"), await get("/healthz")]

    assert asyncio.run(run()) == [200, 404, 599, 599, 599, 599, 599]
    assert len(passed) == 5  # the unchecked token, four other requests


@pytest.mark.slow
def test_a_settled_answer_is_kept_for_the_cache_time_and_no_longer(
        sqlite_ctx: ServiceContext) -> None:
    _settings(sqlite_ctx, lookup_cache_s=0.5)
    done, tuning, pending = (_entry(sqlite_ctx, "heuristic", "done"),
                             _entry(sqlite_ctx, "heuristic", "running"), _entry(sqlite_ctx))
    with TestClient(create_app(ctx=sqlite_ctx), base_url="http://127.0.0.1") as c:
        for key in (done, tuning, pending):
            c.get(f"/v1/schedules/{key}")
        with sqlite_ctx.transaction() as session:  # changed behind the API's back
            for key in (done, tuning):
                store.set_entry_status(session, key, "invalidated", clear_schedule=True)
            assert store.publish_schedule(session, pending, "heuristic", SCHEDULE, [], {})
        changed_at = time.monotonic()
        kept = c.get(f"/v1/schedules/{done}")
        # Only the settled answer is kept; a schedule in the making shows at once.
        assert c.get(f"/v1/schedules/{tuning}").json()["error"]["code"] == "invalidated"
        assert c.get(f"/v1/schedules/{pending}").status_code == 200
        if time.monotonic() - changed_at < 0.5:  # a slow machine may take longer than that
            assert kept.status_code == 200
        time.sleep(0.6)
        gone = c.get(f"/v1/schedules/{done}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "invalidated"


@pytest.mark.slow
def test_an_admin_invalidation_shows_at_once_in_its_process(sqlite_ctx: ServiceContext) -> None:
    _settings(sqlite_ctx, lookup_cache_s=3600.0)
    key = _entry(sqlite_ctx, "heuristic", "done")
    with TestClient(create_app(ctx=sqlite_ctx), base_url="http://127.0.0.1") as c:
        assert c.get(f"/v1/schedules/{key}").status_code == 200
        admin = {"Authorization": "Bearer admin-secret"}
        assert c.post(f"/v1/admin/entries/{key}/invalidate", headers=admin).status_code == 200
        assert c.get(f"/v1/schedules/{key}").json()["error"]["code"] == "invalidated"


@pytest.mark.slow
def test_a_revoked_token_stops_working_within_the_token_cache_time(
        sqlite_ctx: ServiceContext) -> None:
    _settings(sqlite_ctx, host="0.0.0.0", admin_token=PUBLIC_ADMIN, token_cache_s=0.5)
    with sqlite_ctx.transaction() as session:
        token = create_token(session, "client")
        token_id = tokens.list_tokens(session)[-1].id
    key = _entry(sqlite_ctx, "heuristic", "done")
    bearer = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(ctx=sqlite_ctx), base_url="http://kiln.example") as c:
        assert c.get(f"/v1/schedules/{key}", headers=bearer).status_code == 200
        cached = c.app.state.token_roles._cache
        assert token not in str(cached)  # kept by its hash only
        with sqlite_ctx.transaction() as session:
            assert tokens.revoke_token(session, token_id)
        time.sleep(0.6)
        refused = c.get(f"/v1/schedules/{key}", headers=bearer)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"


@pytest.mark.slow
def test_a_locked_database_answers_503_with_retry_after(sqlite_ctx: ServiceContext) -> None:
    key = _entry(sqlite_ctx, "heuristic", "done")
    app = create_app(ctx=sqlite_ctx)
    path = sqlite_ctx.engine.url.database
    with TestClient(app, base_url="http://127.0.0.1") as c:
        sqlite_ctx.engine.dispose()  # no other connection open: the lock below can be taken
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("PRAGMA locking_mode=EXCLUSIVE")
            holder.execute("BEGIN EXCLUSIVE")
            holder.execute("UPDATE schedules SET updated_at = updated_at")
            locked = c.get(f"/v1/schedules/{key}")
            assert locked.status_code == 503, locked.text
            assert locked.headers["retry-after"] == "2"
            assert locked.json()["error"]["code"] == "database_unavailable"
        finally:
            holder.close()
        assert c.get(f"/v1/schedules/{key}").status_code == 200


def test_concurrent_lookups_of_a_key_share_one_read_and_a_forget_wins_over_it(
        sqlite_ctx: ServiceContext) -> None:
    from service.api.lookup_answers import LookupAnswers
    from service.context import HitBuffer
    from service.hotpath import ScheduleReader

    key = _entry(sqlite_ctx, "heuristic", "done")
    reader = ScheduleReader(sqlite_ctx)
    reads = []
    real_lookup = reader.lookup

    async def counted(k: str) -> Any:
        reads.append(k)
        await asyncio.sleep(0.05)  # the read is under way while the others arrive
        return await real_lookup(k)

    reader.lookup = counted  # type: ignore[method-assign]
    answers = LookupAnswers(reader, HitBuffer(), keep_s=3600.0)

    async def run() -> None:
        together = await asyncio.gather(*(answers.answer(key) for _ in range(5)))
        assert len(reads) == 1 and {a.status for a in together} == {200}
        assert (await answers.answer(key)).status == 200 and len(reads) == 1  # kept
        answers.forget(key)
        during = asyncio.ensure_future(answers.answer(key))
        await asyncio.sleep(0.01)
        answers.forget(key)  # the entry changed while that read was under way
        await during
        await answers.answer(key)
        assert len(reads) == 3  # what the read under way saw was not kept
        await reader.close()

    asyncio.run(run())
