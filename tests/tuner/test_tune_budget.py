"""`tune()`'s budget across kernels, on a real graph's schedule and a fake runner (no processes)."""

from __future__ import annotations

import torch

import tuner
from tests.tuner.fakes import FakeGraphRunner
from tuner.records import Candidate


def _two_kernel_graph():
    import compiler
    from compiler.lowering.tracing import trace_inference

    # softmax over rows, then a separate reduction over a second input: two kernels
    gm, ins = trace_inference(
        lambda x, y: (torch.softmax(x, -1), y.sum(-1)), [torch.randn(64, 256), torch.randn(64, 512)]
    )
    return compiler.from_wire(compiler.to_wire(gm, ins))


def _cost_with_big(big: str):
    def cost(c: Candidate) -> float:
        scale = 100.0 if c.kernel == big else 0.1
        return scale * (
            1
            + abs(c.config.get("XBLOCK", 1) - 4) * 0.1
            + abs(c.config.get("num_warps", 1) - 2) * 0.05
        )

    return cost


def test_budget_goes_to_the_kernel_that_dominates() -> None:
    import compiler

    graph = _two_kernel_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    names = [k["name"] for k in compiler.heuristic_schedule(graph, target).to_json()["kernels"]]
    assert len(names) >= 2
    fake = FakeGraphRunner(_cost_with_big(names[-1]))
    result = tuner.tune(graph, target, tuner.Budget(trials=12), runner=fake)
    per_kernel = {k.name: k.trials for k in result.kernels}
    assert result.trials == len(fake.calls) <= 12
    # every kernel got its baseline; the one under 1% of the time got nothing more
    assert all(t >= 1 for t in per_kernel.values())
    assert per_kernel[names[0]] == 1 and per_kernel[names[-1]] > 1
    assert result.schedule.to_json()["status"] == "tuned"
    winner = next(k for k in result.kernels if k.name == names[-1])
    assert winner.tuned_ms <= winner.heuristic_ms


def test_same_measurements_give_the_same_schedule() -> None:
    import compiler

    graph = _two_kernel_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    names = [k["name"] for k in compiler.heuristic_schedule(graph, target).to_json()["kernels"]]
    runs = [
        tuner.tune(
            graph, target, 10, runner=FakeGraphRunner(_cost_with_big(names[-1]))
        ).schedule.to_json()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_a_kernel_whose_candidates_all_fail_keeps_its_config_and_the_rest_are_tuned() -> None:
    import compiler

    graph = _two_kernel_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    base = compiler.heuristic_schedule(graph, target).to_json()["kernels"]
    broken, other = base[0]["name"], base[-1]["name"]
    fake = FakeGraphRunner(
        _cost_with_big(other),
        fails=lambda c: "wrong_answer: output 0: injected" if c.kernel == broken else None)
    result = tuner.tune(graph, target, tuner.Budget(trials=40), runner=fake)
    tuned = {k["name"]: k for k in result.schedule.to_json()["kernels"]}
    assert tuned[broken]["config"] == base[0]["config"]  # the heuristic config stays
    assert tuned[other]["config"] != base[-1]["config"]  # the other kernel still got tuned
    assert result.best_ms < result.heuristic_ms
    assert any(e.startswith(f"{broken}: no verified candidate") and "injected" in e
               for e in result.errors), result.errors


def test_a_tuned_graph_slower_than_the_heuristic_is_not_published() -> None:
    import compiler

    graph = _two_kernel_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    base = compiler.heuristic_schedule(graph, target).to_json()["kernels"]

    class WholeGraphDisagrees(FakeGraphRunner):
        """Kernels win alone, but the whole tuned graph measures 1% slower."""

        def time_graph(self, schedule_json: dict | None, fidelity: float = 1.0) -> dict:
            if schedule_json is None or schedule_json["kernels"] == base:
                return {"ms": 10.0, "error": None}
            return {"ms": 10.1, "error": None}

    result = tuner.tune(graph, target, tuner.Budget(trials=40),
                        runner=WholeGraphDisagrees(_cost_with_big(base[-1]["name"])))
    assert [k["config"] for k in result.schedule.to_json()["kernels"]] == \
        [k["config"] for k in base]
    assert result.best_ms == result.heuristic_ms == 10.0
    assert any("slower than heuristic" in e for e in result.errors)


def test_a_losing_tuned_graph_keeps_its_largest_gains_when_they_win_alone() -> None:
    import compiler

    graph = _two_kernel_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    base = compiler.heuristic_schedule(graph, target).to_json()["kernels"]
    big, small = base[-1]["name"], base[0]["name"]

    configs = {k["name"]: k["config"] for k in base}

    def cost(c: Candidate) -> float:  # any other config wins alone; the big kernel saves more
        return (100.0 if c.kernel == big else 30.0) * (1.0 if c.config == configs[c.kernel] else 0.8)

    class SmallKernelLosesInTheGraph(FakeGraphRunner):
        """Each winner is faster alone; in the whole graph the small kernel's is slower."""

        def time_graph(self, schedule_json: dict | None, fidelity: float = 1.0) -> dict:
            if schedule_json is None:
                return {"ms": 20.0, "error": None}
            changed = {k["name"] for k, b in zip(schedule_json["kernels"], base, strict=True)
                       if k["config"] != b["config"] or k["variant"] != b["variant"]}
            return {"ms": 10.0 - 1.0 * (big in changed) + 1.5 * (small in changed), "error": None}

    fake = SmallKernelLosesInTheGraph(cost)
    result = tuner.tune(graph, target, tuner.Budget(trials=40), runner=fake)
    tuned = {k["name"]: k for k in result.schedule.to_json()["kernels"]}
    before = {k["name"]: k for k in base}
    assert {k.name for k in result.kernels if k.winner.config != k.heuristic.config} == {big, small}
    assert tuned[big]["config"] != before[big]["config"]  # the larger gain is kept
    assert tuned[small]["config"] == before[small]["config"]  # the one that lost in the graph is not
    assert result.best_ms == 9.0 and result.heuristic_ms == 10.0
    assert any("kept the 1 largest measured gains of 2 kernels" in e for e in result.errors), \
        result.errors
