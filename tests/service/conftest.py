"""Fixtures for the service tests: migrated databases and service contexts.

Imports of the web stack stay inside the fixtures, so the GPU test of this folder also runs
on a machine that has torch and triton but not the service's dependencies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def pg_settings(postgres_url: str) -> Any:
    """Settings on a fresh, migrated PostgreSQL database with short leases."""
    from service.migrate import upgrade
    from service.settings import Settings

    upgrade(postgres_url)
    return Settings(database_url=postgres_url, admin_token="admin-secret", lease_s=2.0,
                    heartbeat_s=0.3, max_attempts=3)


@pytest.fixture
def pg_ctx(pg_settings: Any) -> Iterator[Any]:
    """A ServiceContext on migrated PostgreSQL with the in-process queue."""
    from service.context import ServiceContext
    from service.queue import InProcessQueue

    ctx = ServiceContext(pg_settings, queue=InProcessQueue(pg_settings.lease_s))
    yield ctx
    ctx.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_ctx(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """A ServiceContext on a migrated SQLite file, then on PostgreSQL (`pg_ctx`)."""
    if request.param == "postgresql":
        yield request.getfixturevalue("pg_ctx")
        return
    from service.context import ServiceContext
    from service.migrate import upgrade
    from service.settings import Settings

    url = f"sqlite:///{tmp_path / 'k.db'}"
    upgrade(url)
    ctx = ServiceContext(Settings(database_url=url, admin_token="admin-secret"))
    yield ctx
    ctx.close()


@pytest.fixture
def client(pg_ctx: Any) -> Iterator[Any]:
    """The app on `pg_ctx`, in-process (fastapi TestClient)."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        yield c
