"""A costly build holds the embedded service's one worker for seconds, not minutes (issue 30,
point 3): the 1200-step sum/sub chain (552 s before fusion planning became near-linear)
builds, and a small graph submitted after it gets its schedule well within a minute; a
graph past the build budget fails at once with the limit and its size named."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

import compiler
from tests.service.bombs import full_relu, sum_sub_chain
from tests.service.helpers import free_port, start_api, wait_for

# slow: API and worker processes building a 1200-step graph.
pytestmark = pytest.mark.slow

CPU = compiler.Target.detect("cpu").to_json()


def _job(url: str, job_id: int) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()


def _submit(url: str, wire: dict) -> dict:
    answer = httpx.post(f"{url}/v1/graphs", json={"graph": wire, "target": CPU}, timeout=60)
    assert answer.status_code == 202, answer.text
    return answer.json()


def test_a_small_graph_after_a_1200_step_reduction_chain_gets_its_schedule_within_60_s(
        tmp_path: Path) -> None:
    api, url = start_api(tmp_path, free_port(), KILN_DATABASE_URL=f"sqlite:///{tmp_path / 'k.db'}")
    try:
        chain = _submit(url, sum_sub_chain(1200))
        wait_for(lambda: _job(url, chain["job_id"])["status"] == "running", 60,
                 lambda: f"the chain's build did not start:\n{api.log()}", interval=0.2)
        submitted = time.monotonic()
        small = _submit(url, full_relu(16))
        wait_for(lambda: httpx.get(f"{url}/v1/schedules/{small['key']}", timeout=10)
                 .status_code == 200, 60,
                 lambda: f"no schedule for the small graph within 60 s: "
                         f"{_job(url, small['job_id'])}\n{api.log()}", interval=0.3)
        assert time.monotonic() - submitted < 60
        done = wait_for(lambda: _job(url, chain["job_id"])["status"] in ("done", "failed") and
                        _job(url, chain["job_id"]), 60, api.log)
        assert done["status"] == "done", done  # built, within the default budget
    finally:
        api.stop()


def test_a_graph_past_the_build_budget_fails_at_once_naming_the_limit_and_its_size(
        tmp_path: Path) -> None:
    api, url = start_api(tmp_path, free_port(), KILN_DATABASE_URL=f"sqlite:///{tmp_path / 'k.db'}",
                         KILN_MAX_BUILD_COST="50000")
    try:
        chain = _submit(url, sum_sub_chain(1200))
        failed = wait_for(lambda: _job(url, chain["job_id"])["status"] == "failed" and
                          _job(url, chain["job_id"]), 60, api.log, interval=0.3)
        assert failed["attempts"] == 1, failed  # not retried: it would be refused again
        assert "build budget of 50,000 (KILN_MAX_BUILD_COST)" in failed["error"]
        assert "2,400 nodes" in failed["error"] and "1,200 reductions" in failed["error"]
    finally:
        api.stop()
