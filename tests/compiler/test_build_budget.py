"""A build is priced before it starts, and fusion planning is near-linear in the graph
(issue 30, point 3): a chain of n reductions used to grow one group whose every join check
evaluated the whole group, n^2 member evaluations (the 1200-step chain held a worker 552 s).
The work is counted here, never timed."""

from __future__ import annotations

import json

import pytest

import compiler
from compiler.lowering import budget, fusion
from tests.service.bombs import full_relu, sum_sub_chain

CAP = fusion.MAX_GROUP_MEMBERS


def _planned(monkeypatch: pytest.MonkeyPatch, wire: dict) -> tuple[fusion.Planner, compiler.Built]:
    planners: list[fusion.Planner] = []
    run = fusion.Planner.run

    def counted(self: fusion.Planner) -> list:
        planners.append(self)
        return run(self)

    monkeypatch.setattr(fusion.Planner, "run", counted)
    graph = compiler.from_wire(json.dumps(wire))
    built = compiler.build(graph, compiler.heuristic_schedule(graph, compiler.Target.detect("cpu")))
    assert len(planners) == 1
    return planners[0], built


def test_price_counts_nodes_reductions_and_the_fusion_trials_they_bound():
    found = budget.price(compiler.from_wire(json.dumps(sum_sub_chain(1200))))
    assert (found.nodes, found.reductions, found.trial_members) == (2400, 1200, 1200 * CAP)
    assert found.cost == budget.NODE_WEIGHT * 2400 + 1200 * CAP
    few = budget.price(compiler.from_wire(json.dumps(sum_sub_chain(10))))
    assert few.trial_members == 10 * 10  # a group holds every one of them
    assert budget.price(compiler.from_wire(json.dumps(full_relu(8)))).reductions == 0


def test_a_build_over_its_budget_is_refused_naming_the_limit_and_the_size():
    graph = compiler.from_wire(json.dumps(sum_sub_chain(1200)))
    cost = budget.price(graph).cost
    assert budget.check(graph, cost).cost == cost
    assert budget.check(graph, 0).cost == cost  # 0: no limit
    with pytest.raises(budget.BuildRefused) as refused:
        budget.check(graph, cost - 1)
    message = str(refused.value)
    assert "KILN_MAX_BUILD_COST" in message and f"{cost - 1:,}" in message
    assert "2,400 nodes" in message and "1,200 reductions" in message


@pytest.mark.parametrize("steps", [30, 4 * CAP])
def test_fusion_trials_grow_linearly_with_a_reduction_chain(monkeypatch, steps):
    planner, built = _planned(monkeypatch, sum_sub_chain(steps))
    # one check per reduction and per cut, in at most two rounds; each saw at most a full
    # group (its counted members and the cuts it took)
    assert planner.trials <= 2 * 2 * steps
    assert planner.trial_members <= planner.trials * 2 * CAP
    assert planner.trial_members <= budget.price(
        compiler.from_wire(json.dumps(sum_sub_chain(steps)))).trial_members * 2
    assert len(built.kernels) <= steps // CAP + 1  # the output may start the last one
    # a cut kernel reads its predecessor's last value: none recomputes the chain before it
    assert max(len(k.ops) for k in built.kernels) <= 3 * CAP


def test_trials_per_step_stay_flat_as_the_chain_grows(monkeypatch):
    short, _ = _planned(monkeypatch, sum_sub_chain(2 * CAP))
    monkeypatch.undo()
    long, _ = _planned(monkeypatch, sum_sub_chain(8 * CAP))
    # 4x the steps: 4x the member evaluations, give or take the last group (was 16x and more)
    assert long.trial_members <= 4.5 * short.trial_members
