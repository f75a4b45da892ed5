"""End to end with separate processes: `kiln serve` (API) + `kiln worker --device cpu` +
PostgreSQL + Redis, the whole foundations corpus; and the embedded default (`kiln serve`
with no configuration: SQLite and an in-process worker)."""

from __future__ import annotations

import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import compiler
from service.migrate import upgrade
from tests.corpus import corpus
from tests.service.helpers import free_port, gpu_target, start_api, start_worker, wait_for

# slow: API and worker processes, the corpus built through them.
pytestmark = [pytest.mark.services, pytest.mark.slow]


def _schedule(url: str, key: str) -> dict | None:
    r = httpx.get(f"{url}/v1/schedules/{key}", timeout=10)
    return r.json() if r.status_code == 200 else None


def _same_kernels_here(wire: dict, schedule: dict) -> None:
    """The client side: building the fetched schedule here gives the worker's kernels."""
    built = compiler.build(compiler.from_wire(wire), compiler.Schedule.from_json(schedule))
    assert [k.source_hash for k in built.kernels] == \
        [k["source_hash"] for k in schedule["kernels"]]


def test_corpus_through_api_and_cpu_worker_processes(
        tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str) -> None:
    upgrade(postgres_url)
    env = {"KILN_DATABASE_URL": postgres_url, "KILN_REDIS_URL": redis_url,
           "KILN_REDIS_PREFIX": redis_prefix, "KILN_ADMIN_TOKEN": "admin-secret",
           "KILN_LEASE_S": "30", "KILN_KERNEL_DIR": str(tmp_path / "kernels")}
    api, url = start_api(tmp_path, free_port(), **env)
    worker = start_worker(tmp_path, "cpu", **env)
    try:
        cpu = compiler.Target.detect("cpu").to_json()
        bodies = [{"graph": compiler.to_wire(c.gm, c.example_inputs), "target": t,
                   "tag": c.name} for c in corpus() for t in (cpu, gpu_target())]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda b: httpx.post(f"{url}/v1/graphs", json=b, timeout=30),
                                    bodies))
        assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
        keys = [a.json()["key"] for a in answers]
        assert len(set(keys)) == len(bodies)
        wait_for(lambda: all(_schedule(url, k) for k in keys), 150,
                 lambda: f"not every graph got a schedule:\n{worker.log()}", interval=1)
        for body, key in zip(bodies, keys, strict=True):
            got = _schedule(url, key)
            assert got["status"] == "heuristic" and got["schedule"]["graph_hash"] == \
                compiler.graph_hash(compiler.from_wire(body["graph"]))
        # No GPU worker serves sm_90: its jobs end done with the heuristic schedule.
        for answer in answers:
            job = httpx.get(f"{url}/v1/jobs/{answer.json()['job_id']}", timeout=10).json()
            assert job["status"] == "done", job
        for body, key in list(zip(bodies, keys, strict=True))[:4]:
            _same_kernels_here(body["graph"], _schedule(url, key)["schedule"])
        detail = httpx.get(f"{url}/v1/admin/entries/{keys[0]}",
                           headers={"Authorization": "Bearer admin-secret"}, timeout=10).json()
        assert detail["kernels"] and all(k["source"] for k in detail["kernels"])
        assert all(k["compiled"] is None for k in detail["kernels"])  # keys[0]: the CPU target
        # The CPU worker compiled the sm_90 build for sm_90 and kept what each compile gave.
        gpu = httpx.get(f"{url}/v1/admin/entries/{keys[1]}",
                        headers={"Authorization": "Bearer admin-secret"}, timeout=10).json()
        assert gpu["target"]["arch"] == "sm_90" and gpu["kernels"]
        for k in gpu["kernels"]:
            facts = k["compiled"]
            assert facts["arch"] == "sm_90" and facts["registers"] > 0 and facts["binary_bytes"] > 0
    finally:
        worker.stop(signal.SIGTERM)
        api.stop()
    assert worker.popen.returncode == 0, worker.log()  # SIGTERM: a clean stop


def test_embedded_default_serves_and_compiles(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    api, url = start_api(tmp_path, free_port(), HOME=str(home),
                         KILN_KERNEL_DIR=str(tmp_path / "kernels"))
    try:
        # The embedded default keeps a new admin token beside its database, printed once.
        assert re.search(r"log in with the new admin token \(kept in \S+admin-token\): kiln_\S+",
                         api.log())
        assert (home / ".local/share/kiln/kiln.db").exists()
        c = corpus()[0]
        wire = compiler.to_wire(c.gm, c.example_inputs)
        body = {"graph": wire, "target": compiler.Target.detect("cpu").to_json()}
        first = httpx.post(f"{url}/v1/graphs", json=body, timeout=30).json()
        got = wait_for(lambda: _schedule(url, first["key"]), 60, lambda: api.log(), interval=0.3)
        assert got["status"] == "heuristic"
        built = compiler.build(compiler.from_wire(wire), compiler.Schedule.from_json(got["schedule"]))
        import torch

        torch.testing.assert_close(built(*c.example_inputs)[0], c.gm(*c.example_inputs)[0],
                                   rtol=1e-3, atol=1e-3)
    finally:
        api.stop()


def test_64_concurrent_identical_submissions_make_one_job_and_one_schedule_row(
        tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str) -> None:
    from sqlalchemy import create_engine, func, select

    from service.models import JobRow, ScheduleRow
    from service.queue.redis_streams import RedisStreamQueue

    upgrade(postgres_url)
    # 64 bodies pass 4 intake slots, each decoded in a child process: on a loaded 2-core
    # machine the last ones wait past the default 10 s for a slot (503, retry). This test
    # is about one job per key, so they may wait.
    env = {"KILN_DATABASE_URL": postgres_url, "KILN_REDIS_URL": redis_url,
           "KILN_REDIS_PREFIX": redis_prefix, "KILN_RATE_LIMIT_PER_S": "0",
           "KILN_INTAKE_WAIT_S": "150"}
    api, url = start_api(tmp_path, free_port(), **env)
    try:
        c = corpus()[3]
        body = {"graph": compiler.to_wire(c.gm, c.example_inputs), "target": gpu_target()}
        with httpx.Client(timeout=180, limits=httpx.Limits(max_connections=64)) as http, \
                ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(lambda _: http.post(f"{url}/v1/graphs", json=body), range(64)))
        assert {a.status_code for a in answers} == {202}, {a.text for a in answers}
        assert len({a.json()["job_id"] for a in answers}) == 1
        engine = create_engine(postgres_url)
        with engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(JobRow)) == 1
            assert conn.scalar(select(func.count()).select_from(ScheduleRow)) == 1
        engine.dispose()
        assert RedisStreamQueue(redis_url, redis_prefix, 30).depth() == {"build": 1}
    finally:
        api.stop()
