"""Duration histograms, and one consistent /metrics across `kiln serve --workers N`."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from service import metrics
from tests.service.helpers import Proc, _healthy, free_port, service_env, wait_for


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_job_and_step_durations_are_histograms() -> None:
    before = metrics.exposition().decode()
    with metrics.timed("target_compile"):
        pass
    with pytest.raises(RuntimeError), metrics.timed("tune"):
        raise RuntimeError("a failed tuning is timed too")
    metrics.observe_job("build", "done", 1.5)
    after = metrics.exposition().decode()
    for sample in ('kiln_step_seconds_count{step="target_compile"}',
                   'kiln_step_seconds_count{step="tune"}',
                   'kiln_job_seconds_count{outcome="done",stage="build"}'):
        assert _value(after, sample) == _value(before, sample) + 1, sample
    assert 'kiln_job_seconds_bucket{le="2.5",outcome="done",stage="build"}' in after
    with pytest.raises(ValueError, match="step must be one of"):
        with metrics.timed("compile"):
            pass


@pytest.mark.slow
@pytest.mark.services
def test_counters_add_up_across_api_processes(tmp_path: Path, postgres_url: str,
                                              redis_url: str, redis_prefix: str) -> None:
    from service.migrate import upgrade

    upgrade(postgres_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc(["serve", "--port", str(port), "--workers", "2"],
                service_env(KILN_DATABASE_URL=postgres_url, KILN_REDIS_URL=redis_url,
                            KILN_REDIS_PREFIX=redis_prefix, KILN_ADMIN_TOKEN="a" * 40),
                tmp_path / "api.log")
    try:
        wait_for(lambda: _healthy(url), 90, lambda: proc.log(), proc=proc)
        baseline = _value(httpx.get(f"{url}/metrics", timeout=10).text,
                          'kiln_http_requests_total{method="GET",route="/healthz",status="200"}')
        for _ in range(30):  # a new connection each: both processes serve some
            assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        seen = {_value(httpx.get(f"{url}/metrics", timeout=10).text,
                       'kiln_http_requests_total{method="GET",route="/healthz",status="200"}')
                for _ in range(6)}
        assert seen == {baseline + 30}, (baseline, seen)
    finally:
        proc.stop()
