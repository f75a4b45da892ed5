"""Search strategies on a fake runner: deterministic winner, budget respected, failures kept."""

from __future__ import annotations

import math

import pytest

from tests.tuner.fakes import FakeRunner, crash_on_big_xblock, matmul_kernel
from tuner.records import Candidate, Measurement
from tuner.search import Budget, BudgetClock, KernelSearch, pick_winner
from tuner.space import candidates

TARGET = type("T", (), {"device_type": "cuda", "arch": "sm_90"})()

POINTWISE = {
    "name": "fused_add_0",
    "kind": "pointwise",
    "variant": "pointwise",
    "sizes": {"xnumel": 1 << 20},
    "dtype": "float32",
    "config": {"XBLOCK": 256, "num_warps": 4, "num_stages": 1},
}
MATMUL = matmul_kernel()


def _start(kernel: dict) -> Candidate:
    return Candidate.make(kernel["name"], kernel["variant"], kernel["config"])


def bowl(cand: Candidate) -> float:
    """A smooth cost with a unique minimum at XBLOCK=1024, num_warps=8."""
    cfg = cand.config
    return 1.0 + (math.log2(cfg["XBLOCK"]) - 10) ** 2 + (math.log2(cfg["num_warps"]) - 3) ** 2


@pytest.mark.parametrize("strategy", ["exhaustive", "coordinate", "halving"])
def test_strategies_find_the_bowl_minimum(strategy: str) -> None:
    space, _ = candidates(POINTWISE, TARGET)
    search = KernelSearch(space, _start(POINTWISE), FakeRunner(bowl), BudgetClock(Budget()))
    winner = search.run(strategy)
    assert winner is not None
    if strategy != "halving":  # halving samples the space; it must still beat the start
        assert winner.candidate.config["XBLOCK"] == 1024
        assert winner.candidate.config["num_warps"] == 8
    assert winner.ms <= bowl(_start(POINTWISE))


def test_ties_within_noise_go_to_the_first_config_in_fixed_order() -> None:
    space, _ = candidates(POINTWISE, TARGET)
    flat = FakeRunner(lambda c: 1.0 + 0.001 * (hash(c) % 5), noise=0.0)  # all within 1%
    winners = set()
    for order in (space, list(reversed(space))):
        search = KernelSearch(order, _start(POINTWISE), flat, BudgetClock(Budget()))
        winners.add(search.run("exhaustive").candidate)
    assert winners == {min(space, key=Candidate.order_key)}


def test_pick_winner_prefers_clearly_faster_over_order() -> None:
    a = Candidate.make("k", "pointwise", {"XBLOCK": 64, "num_warps": 1})
    b = Candidate.make("k", "pointwise", {"XBLOCK": 128, "num_warps": 1})
    ms = [Measurement(a, ms=1.0, verified=True), Measurement(b, ms=0.9, verified=True)]
    assert pick_winner(ms).candidate == b
    ms = [Measurement(a, ms=1.0, verified=True), Measurement(b, ms=0.995, verified=True)]
    assert pick_winner(ms).candidate == a  # inside the 1% band: fixed order decides


def test_unverified_or_failed_candidates_never_win() -> None:
    a = Candidate.make("k", "pointwise", {"XBLOCK": 64, "num_warps": 1})
    b = Candidate.make("k", "pointwise", {"XBLOCK": 128, "num_warps": 1})
    ms = [Measurement(a, ms=0.1, verified=False), Measurement(b, ms=2.0, verified=True)]
    assert pick_winner(ms).candidate == b
    assert pick_winner([Measurement(a, error="crash: x")]) is None


@pytest.mark.parametrize("strategy", ["exhaustive", "coordinate", "halving", "auto"])
def test_trial_budget_is_never_exceeded(strategy: str) -> None:
    space, _ = candidates(MATMUL, TARGET)
    fake = FakeRunner(lambda c: 1.0 + len(c.label()) * 0.01)
    clock = BudgetClock(Budget(trials=7))
    search = KernelSearch(space, _start(MATMUL), fake, clock)
    search.run(strategy)
    assert len(fake.calls) <= 7
    assert clock.used == len(fake.calls)


def test_seconds_budget_stops_the_search() -> None:
    now = [0.0]
    fake = FakeRunner(bowl, tick=lambda: now.__setitem__(0, now[0] + 1.0))  # 1 s per trial
    space, _ = candidates(POINTWISE, TARGET)
    clock = BudgetClock(Budget(seconds=5.0), clock=lambda: now[0])
    KernelSearch(space, _start(POINTWISE), fake, clock).run("exhaustive")
    assert 1 <= len(fake.calls) <= 6  # may finish the trial that crosses the line


def test_share_limits_one_kernel_within_a_larger_budget() -> None:
    space, _ = candidates(POINTWISE, TARGET)
    fake = FakeRunner(bowl)
    clock = BudgetClock(Budget(trials=100))
    search = KernelSearch(space, _start(POINTWISE), fake, clock, share=4)
    search.run("exhaustive")
    assert search.spent == 4 and clock.used == 4


def test_failures_are_recorded_and_skipped() -> None:
    space, _ = candidates(POINTWISE, TARGET)
    fake = FakeRunner(lambda c: 10.0 / c.config["XBLOCK"], fails=crash_on_big_xblock)
    search = KernelSearch(space, _start(POINTWISE), fake, BudgetClock(Budget()))
    winner = search.run("exhaustive")
    failed = [m for m in search.measurements if m.error]
    assert failed and all(m.reason == "crash" for m in failed)
    assert all(m.candidate.config["XBLOCK"] >= 2048 for m in failed)
    assert winner.candidate.config["XBLOCK"] == 1024  # fastest that did not crash


def test_budget_accepts_int_and_rejects_nonsense() -> None:
    assert Budget.of(5) == Budget(trials=5)
    assert Budget.of(Budget(seconds=2.0)).seconds == 2.0
    with pytest.raises(ValueError):
        Budget.of(0)
    with pytest.raises(TypeError):
        Budget.of("10")


def test_aten_heuristic_still_walks_the_triton_configs_from_its_seed() -> None:
    space, _ = candidates(MATMUL, TARGET)
    aten = Candidate.make("mm_0", "aten", {})
    seed = _start(MATMUL)

    def cost(c: Candidate) -> float:
        if c.variant == "aten":
            return 1.0
        cfg = c.config  # best Triton tile: 128x128x64, 8 warps; beats ATen there
        return 0.9 + 0.05 * sum(
            abs(math.log2(cfg[k]) - math.log2(v))
            for k, v in {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8}.items()
        )

    search = KernelSearch(
        space, aten, FakeRunner(cost), BudgetClock(Budget(trials=60)), seeds=[seed]
    )
    winner = search.run("coordinate")
    assert winner.candidate.variant == "triton"
    assert {
        k: winner.candidate.config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps")
    } == {
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "BLOCK_K": 64,
        "num_warps": 8,
    }
