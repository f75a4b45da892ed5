"""A real `tune()` end to end on the CPU (Triton interpreter), tiny shapes."""

from __future__ import annotations

import pytest
import torch

import tuner
from tuner.session import TrialSession

pytestmark = pytest.mark.xdist_group("tuner_runner")


def _graph(fn, *inputs):
    import compiler
    from compiler.lowering.tracing import trace_inference

    gm, ins = trace_inference(fn, list(inputs))
    return compiler.from_wire(compiler.to_wire(gm, ins)), ins


def test_tune_returns_a_verified_tuned_schedule_within_budget() -> None:
    import compiler

    graph, ins = _graph(
        lambda x, r: torch.softmax(x * 0.125, -1) + r, torch.randn(8, 32), torch.randn(8, 32)
    )
    target = compiler.Target.detect("cpu")
    result = tuner.tune(graph, target, tuner.Budget(trials=6), device="cpu")

    assert result.schedule.to_json()["status"] == "tuned"
    assert 1 <= result.trials <= 6 and len(result.measurements) == result.trials
    assert all(
        {"kernel", "variant", "config", "ms", "error", "verified"} <= m.keys()
        for m in result.measurements
    )
    assert any(m["verified"] and m["ms"] for m in result.measurements)
    assert result.eager_ms and result.heuristic_ms and result.best_ms
    assert result.device == "cpu"  # what the timing child reported it ran on
    # The tuned schedule builds (source hashes check) and computes the graph.
    built = compiler.build(graph, result.schedule)
    (out,) = built(*ins)
    (ref,) = graph.to_fx()(*ins)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_a_deliberately_wrong_candidate_never_counts() -> None:
    """The session's verification step rejects a build whose output is wrong."""
    import compiler

    graph, _ = _graph(lambda x: torch.softmax(x * 0.125, -1), torch.randn(4, 16))
    schedule = compiler.heuristic_schedule(graph, compiler.Target.detect("cpu")).to_json()
    session = TrialSession("cpu")
    session.load(graph.to_json(), schedule, seed=0)
    right = session._build

    def wrong_build(sched: dict):
        built = right(sched)

        def off_by_a_bit(*args):
            (out,) = built(*args)
            return (out * 1.1,)

        return off_by_a_bit

    kernel = schedule["kernels"][0]
    cand = {"kernel": kernel["name"], "variant": kernel["variant"], "config": kernel["config"]}
    ok = session.measure(cand, fidelity=0.3, scope="kernel")
    assert ok["verified"] and ok["error"] is None
    session._builds.clear()
    session._build = wrong_build
    bad = session.measure(cand, fidelity=0.3, scope="kernel")
    assert bad["error"].startswith("wrong_answer") and not bad["verified"] and bad["ms"] is None
