"""Shared fixtures: real PostgreSQL and Redis for the tests that need them.

Without CI set, a missing service skips those tests; with CI set, it fails them, so a
CI run can never go green by skipping the service tests. And a run that leaves a process
behind fails (`pytest_sessionfinish`).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests import processes

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


@pytest.fixture(scope="session", autouse=True)
def _kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Generated kernels go to a directory of the test session, not the user's
    ~/.cache/kiln/kernels (the processes tests start inherit it)."""
    if "KILN_KERNEL_DIR" not in os.environ:
        os.environ["KILN_KERNEL_DIR"] = str(tmp_path_factory.mktemp("kiln_kernels"))


# ---- no process left behind --------------------------------------------------------------
# The run marks its environment (tests/processes.py), so every process a test starts, and
# every process those start, carries the mark unless given an environment without it; at
# the end, those still running (after a grace period) fail the run and are ended. Under
# pytest-xdist the workers inherit the controller's mark and the controller checks, once
# the workers are gone.
_RUN_MARK = pytest.StashKey[dict[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller's mark stays
        return
    mark = processes.new_mark()
    os.environ.update(mark)
    config.stash[_RUN_MARK] = mark


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    mark = session.config.stash.get(_RUN_MARK, None)
    if mark is None:
        return
    left = processes.left_behind(mark)
    if not left:
        return
    processes.end_left_behind(mark)
    lines = [f"{len(left)} process(es) started by the tests were still running at the end "
             "(now killed); the test that started each must end it:"]
    lines += [f"  pid {pid}: {cmd[:300]}" for pid, cmd in sorted(left.items())]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
