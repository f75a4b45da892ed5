"""`kiln stats`, the real command against a real `kiln serve`: the admin API's counts as a
table or JSON, the embedded default's stored admin token on this machine, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service import store
from service.context import ServiceContext
from service.migrate import upgrade
from service.models import JobRow
from service.settings import Settings
from tests.service.helpers import REPO, fake_submission, free_port, service_env, start_api

# slow: an API process and the CLI in another.
pytestmark = pytest.mark.slow


def _seed(url: str) -> None:
    """Two GPU entries (one tuned 2x over eager, one heuristic), a CPU entry 'tuned' on the
    interpreter (900x: must not count), hits and misses; every job done, so the service's
    worker leaves them alone."""
    upgrade(url)
    ctx = ServiceContext(Settings(database_url=url))
    with ctx.transaction() as session:
        subs = [fake_submission(arch="sm_90", name="NVIDIA H200", tag="GPT forward"),
                fake_submission(arch="sm_90", name="NVIDIA H200"), fake_submission(arch="cpu")]
        for sub in subs:
            store.submit(session, sub)
        for sub, status, timings in (
                (subs[0], "tuned", {"eager_ms": 3.0, "heuristic_ms": 2.0, "tuned_ms": 1.5}),
                (subs[1], "heuristic", {"heuristic_ms": 2.0}),
                (subs[2], "tuned", {"eager_ms": 900.0, "tuned_ms": 1.0})):
            assert store.publish_schedule(session, sub.key, status, {"kernels": []}, [], timings)
        session.query(JobRow).update({"status": "done"})
        store.count_lookup(session, "hit", 6)
        store.count_lookup(session, "other_gpu", 2)
    ctx.close()


def kiln_stats(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kiln.cli", "stats", *args], cwd=REPO,
                          env=service_env(**env), capture_output=True, text=True, timeout=120)


def test_stats_reads_the_admin_api(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    _seed(url)
    proc, base = start_api(tmp_path, free_port(), KILN_DATABASE_URL=url)
    try:
        token = (tmp_path / "admin-token").read_text().strip()
        as_json = kiln_stats("--json", KILN_URL=base, KILN_ADMIN_TOKEN=token)
        assert as_json.returncode == 0, as_json.stderr
        stats = json.loads(as_json.stdout)
        assert stats["entries_by_status"]["tuned"] == 2 and stats["hits"] == 6
        assert stats["misses_by_reason"]["other_gpu"] == 2
        assert stats["speedups"] == [2.0] and stats["tuned_fraction"] == 0.5

        # On the server itself no token is needed: the one `kiln serve` stored is read.
        table = kiln_stats("--url", base, KILN_DATABASE_URL=url)
        assert table.returncode == 0, table.stderr
        out = table.stdout
        assert f"kiln service {base}" in out
        assert "tuned fraction: 50.0% of 2 GPU entries with a schedule" in out
        rows = [line.split() for line in out.splitlines()]
        assert ["tuned", "2", "66.7%"] in rows and ["total", "3"] in rows
        assert ["hits", "6", "75.0%"] in rows and ["misses", "2", "25.0%"] in rows
        assert "graph known, other GPU" in out and "workers: none" not in out
        assert "plans: 0 (" in out  # kiln.plans stored

        refused = kiln_stats(KILN_URL=base, KILN_ADMIN_TOKEN="kiln_not-a-token")
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            "kiln stats: the service refused the token: KILN_ADMIN_TOKEN (or KILN_TOKEN) "
            "must be an admin token"]
    finally:
        proc.stop()
    down = kiln_stats(KILN_URL=base, KILN_ADMIN_TOKEN=token)
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert len(down.stderr.strip().splitlines()) == 1 and "is `kiln serve` running" in down.stderr
