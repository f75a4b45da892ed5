"""The runner survives its child: crashes, hangs and errors are measurements with a reason."""

from __future__ import annotations

import pytest
import torch

from tests.tuner.faults import CRASH_XBLOCK, HANG_XBLOCK, RAISE_XBLOCK, crash_or_hang
from tuner.records import Candidate
from tuner.runner import Runner

pytestmark = pytest.mark.xdist_group("tuner_runner")


@pytest.fixture(scope="module")
def tiny() -> tuple[dict, dict]:
    """A small softmax graph and its heuristic schedule, as wire JSON."""
    import compiler
    from compiler.lowering.tracing import trace_inference

    gm, ins = trace_inference(lambda x: torch.softmax(x * 0.125, -1), [torch.randn(4, 16)])
    graph = compiler.from_wire(compiler.to_wire(gm, ins))
    target = compiler.Target.detect("cpu")
    return graph.to_json(), compiler.heuristic_schedule(graph, target).to_json()


def _cand(schedule: dict, xblock: int) -> Candidate:
    kernel = schedule["kernels"][0]
    return Candidate.make(kernel["name"], kernel["variant"], {**kernel["config"], "XBLOCK": xblock})


def _heuristic(schedule: dict) -> Candidate:
    kernel = schedule["kernels"][0]
    return Candidate.make(kernel["name"], kernel["variant"], kernel["config"])


def test_runner_survives_a_candidate_that_kills_its_child(tiny: tuple[dict, dict]) -> None:
    graph, schedule = tiny
    with Runner("cpu", timeout_s=120, fault_hook=crash_or_hang) as runner:
        runner.load(graph, schedule)
        first_pid = runner.pid
        crashed, good = runner.measure([_cand(schedule, CRASH_XBLOCK), _heuristic(schedule)])
        assert crashed.reason == "crash" and "exit code 3" in crashed.error
        assert crashed.ms is None and not crashed.verified
        assert runner.restarts == 1
        # The next candidate ran in a fresh child with the graph reloaded.
        assert good.ok, good.error
        assert runner.pid != first_pid


@pytest.mark.slow
def test_runner_kills_a_hung_candidate_and_carries_on(tiny: tuple[dict, dict]) -> None:
    graph, schedule = tiny
    with Runner("cpu", timeout_s=120, fault_hook=crash_or_hang) as runner:
        runner.load(graph, schedule)
        runner.measure([_heuristic(schedule)])  # the first request pays the child's imports
        runner.timeout_s = 3.0
        (hung,) = runner.measure([_cand(schedule, HANG_XBLOCK)])
        assert hung.reason == "timeout" and hung.ms is None
        runner.timeout_s = 120
        raised, good = runner.measure([_cand(schedule, RAISE_XBLOCK), _heuristic(schedule)])
        assert raised.reason == "run_error" and "injected failure" in raised.error
        assert good.ok, good.error


def test_wrong_or_unbuildable_candidates_are_recorded(tiny: tuple[dict, dict]) -> None:
    graph, schedule = tiny
    kernel = schedule["kernels"][0]
    bogus = Candidate.make(kernel["name"], "no_such_variant", kernel["config"])
    with Runner("cpu", timeout_s=120) as runner:  # no hook: marker configs are just configs
        runner.load(graph, schedule)
        (m,) = runner.measure([bogus])
        assert m.reason == "build_error" and not m.verified
        eager = runner.time_graph(None)
        assert eager["error"] is None and eager["ms"] > 0


def test_parallel_compile_workers_report_unbuildable_candidates_first(
    tiny: tuple[dict, dict],
) -> None:
    graph, schedule = tiny
    kernel = schedule["kernels"][0]
    bogus = Candidate.make(kernel["name"], "no_such_variant", kernel["config"])
    with Runner("cpu", timeout_s=120, compile_workers=1) as runner:
        runner.load(graph, schedule)
        runner.prepare([bogus, _heuristic(schedule)])
        assert runner.builder.prepared == {bogus, _heuristic(schedule)}
        assert runner.builder.verdicts[bogus].startswith("build_error")
        bad, good = runner.measure([bogus, _heuristic(schedule)])
        assert bad.reason == "build_error"
        assert good.ok, good.error
