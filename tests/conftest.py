"""Shared fixtures: real PostgreSQL and Redis for the tests that need them.

Without CI set, a missing service skips those tests; with CI set, it fails them, so a
CI run can never go green by skipping the service tests.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest

PG_HOST, PG_PORT = os.environ.get("KILN_TEST_PG_HOST", "127.0.0.1"), 5432
REDIS_HOST, REDIS_PORT = os.environ.get("KILN_TEST_REDIS_HOST", "127.0.0.1"), 6379


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (under CI) when a real service does not answer."""
    if _answers(host, port):
        return
    message = f"{name} does not answer on {host}:{port}; start it (see README: Services)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    require_service("PostgreSQL", PG_HOST, PG_PORT)
    import psycopg

    name = f"kiln_test_{uuid.uuid4().hex[:12]}"
    admin = f"host={PG_HOST} port={PG_PORT} dbname=test user=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_url() -> str:
    """URL of the shared Redis. Tests share it: isolate with `redis_prefix`, and never
    restart or flush it (fault tests start a private redis-server of their own)."""
    require_service("Redis", REDIS_HOST, REDIS_PORT)
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix unique to this test; its keys are deleted afterwards."""
    import redis

    prefix = f"kiln-test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
