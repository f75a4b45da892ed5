"""Fixtures for the service tests: migrated databases and service contexts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.context import ServiceContext
from service.migrate import upgrade
from service.queue import InProcessQueue
from service.settings import Settings


@pytest.fixture
def pg_settings(postgres_url: str) -> Settings:
    """Settings on a fresh, migrated PostgreSQL database with short leases."""
    upgrade(postgres_url)
    return Settings(database_url=postgres_url, admin_token="admin-secret", lease_s=2.0,
                    heartbeat_s=0.3, max_attempts=3)


@pytest.fixture
def pg_ctx(pg_settings: Settings) -> Iterator[ServiceContext]:
    """A ServiceContext on migrated PostgreSQL with the in-process queue."""
    ctx = ServiceContext(pg_settings, queue=InProcessQueue(pg_settings.lease_s))
    yield ctx
    ctx.close()
