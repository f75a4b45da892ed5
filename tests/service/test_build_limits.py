"""A CPU worker's build is bounded (issue 15, point 1): the interpreter check by the largest
tensor the graph makes (intermediates included), the whole build by a child process with a
memory cap and a time limit, so that a tiny graph can neither exhaust the host nor hold
the worker past its limit."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

import compiler
from service import build_child, pipeline
from service.migrate import upgrade
from tests.service.bombs import expand_sum, full_relu, sum_sub_chain
from tests.service.helpers import free_port, start_api, start_worker, wait_for

CPU = compiler.Target.detect("cpu").to_json()


def test_interpreter_check_is_bounded_by_the_largest_intermediate_not_the_inputs():
    # No inputs at all, an 8192 x 8192 intermediate: the check used to run (4.5 GB).
    outcome = pipeline.build_kernels(json.dumps(full_relu(8192)), CPU, 1 << 16)
    assert "not checked on the Triton interpreter: its largest tensor has 67108864 elements" \
        in outcome.note
    assert outcome.kernels
    small = pipeline.build_kernels(json.dumps(full_relu(64)), CPU, 1 << 16)
    assert small.note == "heuristic build, checked on the Triton interpreter"


def test_interpreter_check_is_bounded_by_all_tensors_together():
    # 40 relus of a 64 x 64 input: no tensor over 4096 elements, 41 x 4096 together.
    wire = full_relu(64)
    wire["nodes"] += [{"name": f"r{i}", "op": "aten.relu.default",
                       "args": [{"ref": "relu" if i == 0 else f"r{i - 1}"}], "kwargs": {},
                       "meta": wire["nodes"][0]["meta"]} for i in range(39)]
    wire["outputs"] = [{"ref": "r38"}]
    graph = compiler.from_wire(wire)
    assert pipeline.tensor_sizes(graph) == (4096, 41 * 4096)
    assert pipeline.interpreter_refusal(graph, 41 * 4096 // pipeline.INTERPRET_TOTAL_FACTOR + 1) \
        is None
    refusal = pipeline.interpreter_refusal(graph, 4096)
    assert refusal is not None and f"{41 * 4096} elements together" in refusal


def test_build_child_returns_the_build():
    outcome = build_child.build_in_child(json.dumps(full_relu(64)), CPU, 1 << 16,
                                         timeout_s=120, memory_bytes=2 << 30)
    assert outcome.note == "heuristic build, checked on the Triton interpreter"
    assert outcome.kernels[0]["source"].startswith("import triton")


def test_build_child_past_its_memory_cap_fails_with_the_limit_named():
    # The interpreter bound lifted: the child tries to allocate 1 GB tensors under a 512 MB cap.
    start = time.monotonic()
    with pytest.raises(build_child.BuildLimitError, match="more memory than its limit of 512 MB"):
        build_child.build_in_child(json.dumps(full_relu(16384)), CPU, 1 << 40,
                                   timeout_s=120, memory_bytes=512 << 20)
    assert time.monotonic() - start < 60


def test_build_child_past_its_time_limit_is_killed_at_once():
    build_child.build_in_child(json.dumps(full_relu(8)), CPU, 1 << 16, timeout_s=120,
                               memory_bytes=0)  # the fork server is up: time only the build
    start = time.monotonic()
    with pytest.raises(build_child.BuildLimitError, match="time limit of 1.5 s"):
        # 268M elements summed on the interpreter: minutes, were it not stopped.
        build_child.build_in_child(json.dumps(expand_sum(16384)), CPU, 1 << 40, timeout_s=1.5,
                                   memory_bytes=1 << 30)
    assert time.monotonic() - start < 5


def test_build_child_refuses_a_graph_over_its_build_budget_before_lowering():
    start = time.monotonic()
    with pytest.raises(build_child.BuildLimitError,
                       match=r"2,400 nodes.*1,200 reductions.*KILN_MAX_BUILD_COST"):
        build_child.build_in_child(json.dumps(sum_sub_chain(1200)), CPU, 1 << 16, timeout_s=120,
                                   memory_bytes=0, max_cost=10_000)
    assert time.monotonic() - start < 60  # priced, not built


def test_a_failing_build_reports_the_child_error():
    with pytest.raises(build_child.BuildFailed, match="WireError"):
        build_child.build_in_child("{}", CPU, 1 << 16, timeout_s=120, memory_bytes=0)


@pytest.mark.slow
@pytest.mark.services
def test_worker_process_frees_itself_from_a_build_past_its_time_limit(
        tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str) -> None:
    """Separate API and worker processes: a graph whose interpreter check would run for
    minutes fails after KILN_BUILD_TIMEOUT_S, once (not retried), and the next graph builds."""
    upgrade(postgres_url)
    env = {"KILN_DATABASE_URL": postgres_url, "KILN_REDIS_URL": redis_url,
           "KILN_REDIS_PREFIX": redis_prefix, "KILN_BUILD_TIMEOUT_S": "4",
           "KILN_INTERPRET_MAX_NUMEL": str(1 << 40), "KILN_BUILD_MEMORY_MB": "1024"}
    api, url = start_api(tmp_path, free_port(), **env)
    worker = start_worker(tmp_path, "cpu", **env)
    try:
        slow = httpx.post(f"{url}/v1/graphs", json={"graph": expand_sum(16384), "target": CPU},
                          timeout=30)
        small = httpx.post(f"{url}/v1/graphs", json={"graph": full_relu(16), "target": CPU},
                           timeout=30)
        assert slow.status_code == small.status_code == 202, (slow.text, small.text)

        def job(answer: httpx.Response) -> dict:
            return httpx.get(f"{url}/v1/jobs/{answer.json()['job_id']}", timeout=10).json()

        wait_for(lambda: job(small)["status"] == "done", 90,
                 lambda: f"the small graph was not built:\n{worker.log()}", interval=0.5)
        failed = job(slow)
        assert failed["status"] == "failed" and failed["attempts"] == 1, (failed, worker.log())
        assert "time limit of 4 s" in failed["error"]
        started = next(e["at"] for e in failed["history"] if e["status"] == "running")
        from datetime import datetime
        took = (datetime.fromisoformat(failed["finished_at"]) -
                datetime.fromisoformat(started)).total_seconds()
        assert took < 15, failed  # the limit plus the child's start, not the build's minutes
    finally:
        worker.stop(signal.SIGTERM)
        api.stop()
