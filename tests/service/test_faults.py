"""Faults with separate processes: a worker killed mid-job, Redis restarted, PostgreSQL
stopped. API and workers run as their own processes against real PostgreSQL and Redis."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.migrate import upgrade
from tests.service.helpers import free_port, start_api, start_worker, wait_for, wire_body
from tests.service.private_services import PrivatePostgres, PrivateRedis

# slow: worker processes killed, servers stopped and restarted.
pytestmark = [pytest.mark.services, pytest.mark.slow]
ADMIN = {"Authorization": "Bearer admin-secret"}
CASES = ["mlp.fwd", "mlp.train_fwd", "mlp.train_bwd", "embedding_ce.fwd", "convnet.fwd",
         "gpt_block.fwd"]


def _env(database_url: str, redis_url: str, prefix: str) -> dict[str, str]:
    return {"KILN_DATABASE_URL": database_url, "KILN_REDIS_URL": redis_url,
            "KILN_REDIS_PREFIX": prefix, "KILN_LEASE_S": "2", "KILN_HEARTBEAT_S": "0.3",
            "KILN_ADMIN_TOKEN": "admin-secret", "KILN_RATE_LIMIT_PER_S": "0"}


def _job(url: str, job_id: int) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=5).json()


def _post_until_accepted(url: str, body: dict, timeout: float = 30) -> dict:
    """Submit like a client: retry while the service answers 503."""
    def attempt() -> dict | None:
        try:
            r = httpx.post(f"{url}/v1/graphs", json=body, timeout=5)
        except httpx.HTTPError:
            return None
        if r.status_code == 503:
            return None
        assert r.status_code in (200, 202), r.text
        return r.json()
    return wait_for(attempt, timeout, "the API never accepted the submission", interval=0.3)


def _concurrent_gets(url: str, key: str, n: int = 8) -> list[int]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: httpx.get(f"{url}/v1/schedules/{key}", timeout=10)
                             .status_code, range(n)))


@pytest.fixture
def procs() -> Iterator[list]:
    started: list = []
    yield started
    for p in started:
        p.stop(signal.SIGKILL)


def test_kill_9_a_worker_holding_a_job_another_finishes_it(
        tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str, procs: list) -> None:
    upgrade(postgres_url)
    env = _env(postgres_url, redis_url, redis_prefix)
    api, url = start_api(tmp_path, free_port(), **env)
    procs.append(api)
    doomed = start_worker(tmp_path, "doomed", delay=120, **env)
    procs.append(doomed)
    job_id = _post_until_accepted(url, wire_body())["job_id"]
    wait_for(lambda: _job(url, job_id)["status"] == "running", 30,
             lambda: f"the job never started:\n{doomed.log()}")
    doomed.popen.kill()  # SIGKILL: no chance to give the job back
    doomed.popen.wait(10)
    rescuer = start_worker(tmp_path, "rescuer", delay=0, **env)
    procs.append(rescuer)
    wait_for(lambda: _job(url, job_id)["status"] == "done", 40,
             lambda: f"the job was not taken over:\n{rescuer.log()}")
    job = _job(url, job_id)
    workers = [e["worker"] for e in job["history"] if e["status"] == "running"]
    assert job["attempts"] == 2 and len(set(workers)) == 2
    # The killed worker does not stay `running` on the dashboard: its heartbeat stopped.
    def doomed_status() -> str | None:
        stats = httpx.get(f"{url}/v1/admin/stats", headers=ADMIN, timeout=5).json()
        return {w["id"]: w["status"] for w in stats["workers"]}.get(workers[0])
    wait_for(lambda: doomed_status() == "dead", 30, lambda: f"worker {workers[0]} not dead")


def test_redis_restart_mid_run_loses_no_job(tmp_path: Path, postgres_url: str, procs: list) -> None:
    upgrade(postgres_url)
    redis = PrivateRedis()
    redis.start()
    try:
        env = _env(postgres_url, redis.url, "kiln:")
        api, url = start_api(tmp_path, free_port(), **env)
        procs.append(api)
        worker = start_worker(tmp_path, "w", delay=1.0, **env)
        procs.append(worker)
        jobs = [_post_until_accepted(url, wire_body(c))["job_id"] for c in CASES[:3]]
        redis.stop()  # everything in Redis is gone: streams, groups, pending messages
        down = httpx.post(f"{url}/v1/graphs", json=wire_body(CASES[3]), timeout=10)
        assert down.status_code == 503 and down.json()["error"]["code"] == "queue_unavailable"
        redis.start()
        jobs += [_post_until_accepted(url, wire_body(c))["job_id"] for c in CASES[3:]]
        wait_for(lambda: all(_job(url, j)["status"] == "done" for j in jobs), 60,
                 lambda: f"jobs lost: {[_job(url, j) for j in jobs]}")
        # At least one job was still in Redis when it died: the database put it back.
        assert "after the queue lost its state" in worker.log() + api.log()
    finally:
        redis.close()


def test_postgres_stopped_answers_503_and_recovers(
        tmp_path: Path, redis_url: str, redis_prefix: str, procs: list) -> None:
    pg = PrivatePostgres()
    pg.start()
    try:
        upgrade(pg.url)
        env = _env(pg.url, redis_url, redis_prefix)
        api, url = start_api(tmp_path, free_port(), **env)
        procs.append(api)
        procs.append(start_worker(tmp_path, "w", delay=0, **env))
        first = _post_until_accepted(url, wire_body(CASES[0]))
        wait_for(lambda: _job(url, first["job_id"])["status"] == "done", 30)
        assert _concurrent_gets(url, first["key"]) == [200] * 8  # several pooled connections
        pg.stop()
        time.sleep(1.5)  # past KILN_LOOKUP_CACHE_S (1 s): the lookup's kept answer is gone
        for r in (httpx.get(f"{url}/v1/schedules/{first['key']}", timeout=10),
                  httpx.post(f"{url}/v1/graphs", json=wire_body(CASES[1]), timeout=10)):
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 503
        pg.start()
        wait_for(lambda: httpx.get(f"{url}/readyz", timeout=10).status_code == 200, 30)
        # Every pooled connection died with the server: none may surface as an error now.
        assert _concurrent_gets(url, first["key"]) == [200] * 8
        second = _post_until_accepted(url, wire_body(CASES[1]))
        wait_for(lambda: _job(url, second["job_id"])["status"] == "done", 30)
        stats = httpx.get(f"{url}/v1/admin/stats", headers=ADMIN, timeout=10).json()
        assert stats["entries_by_status"]["heuristic"] == 2
    finally:
        pg.close()


def test_sigterm_finishes_the_job_in_hand_and_a_second_gives_it_back(
        tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str, procs: list) -> None:
    import time

    upgrade(postgres_url)
    env = _env(postgres_url, redis_url, redis_prefix)
    api, url = start_api(tmp_path, free_port(), **env)
    procs.append(api)
    polite = start_worker(tmp_path, "polite", delay=2, **env)
    procs.append(polite)
    first = _post_until_accepted(url, wire_body(CASES[0]))["job_id"]
    wait_for(lambda: _job(url, first)["status"] == "running", 30, polite.log)
    polite.popen.send_signal(signal.SIGTERM)
    assert polite.popen.wait(30) == 0
    assert _job(url, first)["status"] == "done"

    hurried = start_worker(tmp_path, "hurried", delay=60, **env)
    procs.append(hurried)
    second = _post_until_accepted(url, wire_body(CASES[1]))["job_id"]
    wait_for(lambda: _job(url, second)["status"] == "running", 30, hurried.log)
    hurried.popen.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    hurried.popen.send_signal(signal.SIGTERM)
    assert hurried.popen.wait(30) == 0
    job = _job(url, second)
    assert job["status"] == "queued" and job["attempts"] == 0, job
    assert job["history"][-1]["message"] == "worker stopped; job given back"


def test_a_job_that_kills_every_worker_ends_failed_after_n_attempts(
        tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str, procs: list) -> None:
    upgrade(postgres_url)
    env = {**_env(postgres_url, redis_url, redis_prefix), "KILN_LEASE_S": "1",
           "KILN_MAX_ATTEMPTS": "2"}
    api, url = start_api(tmp_path, free_port(), **env)
    procs.append(api)
    job_id = _post_until_accepted(url, wire_body())["job_id"]
    for i in range(3):  # a supervisor restarting the worker after each crash
        worker = start_worker(tmp_path, f"doomed-{i}", delay=0, die=True, **env)
        procs.append(worker)
        wait_for(lambda w=worker: w.popen.poll() is not None
                 or _job(url, job_id)["status"] == "failed", 60, worker.log)
        if _job(url, job_id)["status"] == "failed":
            break
    job = _job(url, job_id)
    # Two workers died in the build; the third found the job out of attempts.
    assert i == 2 and worker.popen.poll() is None, job
    assert job["attempts"] == 3 and "gave up after 2 attempts" in job["error"]
    assert "died" in job["error"]
