"""Fair queueing per tenant, end to end: the embedded default (`kiln serve`, SQLite and its
in-process worker) over real HTTP. Also the migration that gives jobs their tenant."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import create_engine, text

import compiler
from service.migrate import upgrade
from tests.service.helpers import free_port, service_env, start_api, wait_for

pytestmark = pytest.mark.services


def _graph(i: int) -> dict:
    """A small graph of its own for each i (its shape differs), so each is its own job."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 8 + i)
    gm = make_fx(lambda x: (torch.relu(x * 3.0 + 1.0).sum(dim=1),))(x)
    return compiler.to_wire(gm, [x])


def _started(job: dict) -> datetime:
    """When a worker first took the job."""
    return min(datetime.fromisoformat(e["at"]) for e in job["history"] if e["status"] == "running")


@pytest.mark.slow
def test_one_tenants_backlog_delays_anothers_first_graph_by_at_most_one_build(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "KILN_KERNEL_DIR": str(tmp_path / "kernels")}
    api, url = start_api(tmp_path, free_port(), **env)
    try:
        admin = re.search(r"log in with the new admin token \(kept in \S+\): (kiln_\S+)",
                          api.log()).group(1)
        made = subprocess.run([sys.executable, "-m", "kiln.cli", "token", "create", "--role",
                               "client", "--tenant", "team-a"], env=service_env(**env),
                              capture_output=True, text=True, timeout=120, check=True)
        team_a = {"Authorization": f"Bearer {made.stdout.split()[-1]}"}
        target = compiler.Target.detect("cpu").to_json()
        backlog = 8
        bodies = [{"graph": _graph(i), "target": target} for i in range(backlog + 1)]
        with httpx.Client(timeout=60) as http, ThreadPoolExecutor(4) as pool:
            a_answers = list(pool.map(lambda b: http.post(f"{url}/v1/graphs", json=b,
                                                          headers=team_a), bodies[:backlog]))
            assert [a.status_code for a in a_answers] == [202] * backlog, \
                [a.text for a in a_answers]
            # Tenant `local` (an anonymous loopback caller) submits its first graph.
            b_answer = http.post(f"{url}/v1/graphs", json=bodies[backlog])
            assert b_answer.status_code == 202, b_answer.text
            ids = [a.json()["job_id"] for a in a_answers] + [b_answer.json()["job_id"]]
            as_admin = {"Authorization": f"Bearer {admin}"}

            def jobs() -> list[dict]:
                return [http.get(f"{url}/v1/jobs/{i}", headers=as_admin).json() for i in ids]

            done = wait_for(lambda: (js := jobs()) and all(j["status"] == "done" for j in js)
                            and js, 300, lambda: f"not all built:\n{api.log()[-3000:]}",
                            interval=0.5)
        *a_jobs, b_job = done
        assert {j["tenant"] for j in a_jobs} == {"team-a"} and b_job["tenant"] == "local"
        submitted, b_started = datetime.fromisoformat(b_job["created_at"]), _started(b_job)
        a_starts = sorted(_started(j) for j in a_jobs)
        # B's graph was built before A's backlog finished...
        assert a_starts[-1] > b_started, (a_starts, submitted, b_started)
        # ...and at most one of A's builds started between B's submission and B's build.
        assert sum(submitted < s < b_started for s in a_starts) <= 1, (a_starts, submitted,
                                                                        b_started)
    finally:
        api.stop()


@pytest.mark.parametrize("backend_name", ["sqlite", "postgresql"])
def test_migration_0010_gives_existing_jobs_their_first_owners_tenant(
        backend_name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from alembic import command

    from service.migrate import alembic_config

    url = request.getfixturevalue("postgres_url") if backend_name == "postgresql" \
        else f"sqlite:///{tmp_path / 'k.db'}"
    upgrade(url, "0009")
    engine = create_engine(url)
    now = "2026-12-01 00:00:00+00:00"
    try:
        with engine.begin() as conn:
            for h, tenant in (("a" * 64, "team-a"), ("b" * 64, "team-b")):
                conn.execute(text("INSERT INTO api_tokens (token_hash, role, tenant, created_at, "
                                  "revoked) VALUES (:h, 'client', :t, :now, false)"),
                             {"h": h, "t": tenant, "now": now})
            conn.execute(text("INSERT INTO graphs (graph_hash, op_summary, num_nodes, created_at)"
                              " VALUES (:g, '{}', 1, :now)"), {"g": "0" * 64, "now": now})
            for job_id in (1, 2, 3):
                key = f"{job_id}" * 64
                conn.execute(text(
                    "INSERT INTO schedules (key, graph_hash, device_type, arch, device_name, "
                    "torch_version, triton_version, compiler_version, queue_class, status, "
                    "hits, created_at, updated_at) VALUES (:k, :g, 'cpu', 'cpu', 'cpu', '2', "
                    "'3', '1', 'cpu', 'pending', 0, :now, :now)"),
                    {"k": key, "g": "0" * 64, "now": now})
                conn.execute(text(
                    "INSERT INTO jobs (id, key, stage, status, progress, attempts, "
                    "needs_enqueue, created_at, updated_at) VALUES (:i, :k, 'build', 'queued', "
                    "0, 0, false, :now, :now)"), {"i": job_id, "k": key, "now": now})
            # Job 1: owned by B's and A's tokens (A's hash sorts first); job 2: a token since
            # deleted; job 3: no owner (an anonymous caller).
            for job_id, owner in ((1, "b" * 64), (1, "a" * 64), (2, "c" * 64)):
                conn.execute(text("INSERT INTO job_owners (job_id, owner) VALUES (:j, :o)"),
                             {"j": job_id, "o": owner})
        upgrade(url)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, tenant FROM jobs ORDER BY id")).all() == [
                (1, "team-a"), (2, "default"), (3, "default")]
        engine.dispose()
        command.downgrade(alembic_config(url), "0009")
        with engine.begin() as conn:
            columns = conn.execute(text("SELECT * FROM jobs")).keys()
            assert "tenant" not in columns
    finally:
        engine.dispose()
