"""`tuner.tune(graph, target, budget) -> TuningResult`: the heuristic schedule, made fastest.

Steps: heuristic schedule -> child runner loads the graph (reference outputs on seeded
inputs) -> eager and heuristic whole-graph times -> per distinct kernel: pruned space,
search within its share of the budget -> winners written into the schedule -> the tuned
schedule built, verified and timed as a whole. Kernels are separate launches, so each is
tuned on its own with the others at their heuristic configs. Twins, the same kernel in each
of a model's repeated layers (`tuner.session.twin_keys`), are searched once and share the
winner, so tuning time grows with the distinct kernels, not with depth.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from compiler.codegen import kinds
from tuner.records import Candidate, Measurement, stand_in
from tuner.runner import DEFAULT_TIMEOUT_S, Runner
from tuner.search import Budget, BudgetClock, KernelSearch, pick_winner
from tuner.space import candidates
from tuner.timing import MIN_NOISE_FRACTION

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]
# A tuned whole graph slower than the heuristic one (same run, same timer) falls back to the
# heuristic: tuning never publishes a regression.
REGRESSION_MARGIN = 0.0
# Halvings of a tuned graph's changes tried when the whole graph lost (`_back_off`).
BACKOFF_ROUNDS = 4
# Kernels under this fraction of the graph's kernel time are not worth a search.
MIN_WEIGHT = 0.01


@dataclass
class KernelResult:
    """One kernel's search: baseline, winner, how much of the space was seen."""

    name: str
    kind: str
    heuristic: Candidate
    winner: Candidate
    heuristic_ms: float | None
    tuned_ms: float | None
    strategy: str
    space: int
    pruned: int
    trials: int
    twin_of: str | None = None  # the identical kernel whose search this one took

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "heuristic": self.heuristic.to_json(),
            "winner": self.winner.to_json(),
            "heuristic_ms": self.heuristic_ms,
            "tuned_ms": self.tuned_ms,
            "strategy": self.strategy,
            "space": self.space,
            "pruned": self.pruned,
            "trials": self.trials,
            "twin_of": self.twin_of,
        }


@dataclass
class TuningResult:
    """The tuned schedule and everything measured on the way (docs/contracts.md)."""

    schedule: Any  # compiler.Schedule, status "tuned"
    measurements: list[dict[str, Any]]
    eager_ms: float | None
    heuristic_ms: float | None
    best_ms: float | None
    trials: int
    seconds: float
    kernels: list[KernelResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # The device the timing child reported (`cuda:N` or `cpu`); None from a runner that
    # does not say.
    device: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule.to_json(),
            "measurements": self.measurements,
            "eager_ms": self.eager_ms,
            "heuristic_ms": self.heuristic_ms,
            "best_ms": self.best_ms,
            "trials": self.trials,
            "seconds": self.seconds,
            "kernels": [k.to_json() for k in self.kernels],
            "errors": self.errors,
            "device": self.device,
        }


def _leaders(kernels: list[dict[str, Any]], twins: dict[str, str]) -> list[int]:
    """For each kernel, the index of the first kernel with its twin key (itself when it has
    none or is the first): only leaders are searched, twins take their winner."""
    first: dict[str, int] = {}
    out = []
    for i, kernel in enumerate(kernels):
        key = twins.get(kernel["name"])
        out.append(i if key is None else first.setdefault(key, i))
    return out


def _winner(search: KernelSearch) -> Measurement | None:
    """The search's winner, or its heuristic start when the start is as fast within the
    noise band: a config only changes for a measured gain."""
    winner = pick_winner(search.measurements)
    if winner is None or winner.candidate == search.start:
        return winner
    start = pick_winner([m for m in search.measurements if m.candidate == search.start])
    band = max(MIN_NOISE_FRACTION, winner.noise / winner.ms if winner.ms else 0.0)
    return start if start is not None and start.ms <= winner.ms * (1 + band) else winner


def _no_winner(name: str, search: KernelSearch) -> str:
    """Why a kernel keeps its heuristic config: no candidate, its start included, verified."""
    failed = [m.error for m in search.measurements if m.error]
    why = failed[0] if failed else "nothing measured"
    return f"{name}: no verified candidate ({len(failed)} failed; first: {why}); keeps its heuristic config"


def default_device(target: Any) -> str:
    """Where to time for a target: its CUDA device when the target is a GPU, else the CPU."""
    return "cuda" if getattr(target, "device_type", "cpu") == "cuda" else "cpu"


def _paired_times(
    runner: Any, tuned: Any, base: Any, first_heuristic: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Whole-graph times of the tuned and the heuristic schedule (`compiler.Schedule`s),
    taken back to back twice (tuned, heuristic, tuned, heuristic) and each the faster of its
    two: whole-graph times drift between the start and the end of a tuning run, so only
    neighbours compare."""
    if tuned.kernels == base.kernels:
        return runner.time_graph(tuned.to_json()), first_heuristic
    runs = [runner.time_graph(s.to_json()) for s in (tuned, base, tuned, base)]

    def best(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        if a.get("ms") is None or a.get("error"):
            return a
        if b.get("ms") is None or b.get("error"):
            return b
        return a if a["ms"] <= b["ms"] else b

    heuristic = best(runs[1], runs[3])
    if heuristic.get("error") and not first_heuristic.get("error"):
        heuristic = first_heuristic
    return best(runs[0], runs[2]), heuristic


def _with_changes(base: Any, changes: list[tuple[int, Candidate, str | None]],
                  leaders: set[int]) -> Any:
    """`base` with the chosen configs of the kernels whose leader is in `leaders`."""
    from tuner.session import schedule_with

    schedule = base
    for leader, chosen, source in changes:
        if leader in leaders:
            schedule = schedule_with(schedule, chosen, source)
    return replace(schedule, status="tuned")


def _back_off(
    runner: Any, base: Any, changes: list[tuple[int, Candidate, str | None]],
    savings: dict[int, float], heuristic: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], Any, int] | None:
    """When the whole tuned graph lost to the heuristic: the changes of the kernels with the
    largest measured savings alone, half of them, then a quarter, ... (BACKOFF_ROUNDS at
    most), each timed beside the heuristic; the first that beats it (its time, the paired
    heuristic time, the schedule, how many kernels kept), or None. A kernel's gain measured
    alone can turn into a loss in the graph (caches warm from its neighbours, clocks), so
    the gains most likely to be real are kept first."""
    ranked = sorted(savings, key=lambda i: (-savings[i], i))
    keep = len(ranked) // 2
    for _ in range(BACKOFF_ROUNDS):
        if keep < 1:
            break
        trial = _with_changes(base, changes, set(ranked[:keep]))
        timed, paired = _paired_times(runner, trial, base, heuristic)
        if not timed.get("error") and timed.get("ms") is not None and paired.get("ms") \
                and timed["ms"] < paired["ms"]:
            return timed, paired, trial, keep
        keep //= 2
    return None


def tune(
    graph: Any,
    target: Any,
    budget: Budget | int | None = None,
    *,
    device: str | None = None,
    seed: int = 0,
    strategy: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    runner: Runner | None = None,
    progress: Progress | None = None,
) -> TuningResult:
    """Tune every kernel of `graph` for `target` within `budget`; the tuned schedule and the record.

    `graph` is a `compiler.Graph` or a kiln.graph/1 dict; `budget` a `Budget` or a trial
    count. Candidates are timed on `device` (default: CUDA for a GPU target, else the CPU
    with the Triton interpreter) in a spawned child; pass `runner` to reuse one.
    Every measured candidate, failed ones included, is in `measurements`.
    """
    import compiler

    started = time.monotonic()
    budget = Budget.of(budget)
    if not isinstance(graph, compiler.Graph):
        graph = compiler.from_wire(graph)
    graph_json = graph.to_json()
    base = compiler.heuristic_schedule(graph, target)
    own_runner = runner is None
    runner = runner or Runner(device or default_device(target), timeout_s=timeout_s)
    try:
        return _tune_loaded(
            graph_json, target, base, budget, runner, seed, strategy, progress, started
        )
    finally:
        if own_runner:
            runner.close()


def _tune_loaded(
    graph_json: dict[str, Any],
    target: Any,
    base: Any,
    budget: Budget,
    runner: Runner,
    seed: int,
    strategy: str,
    progress: Progress | None,
    started: float,
) -> TuningResult:
    import compiler

    # The heuristic `compiler.Schedule`; its JSON goes to the child and the search spaces.
    base_json = base.to_json()
    kernels = base_json["kernels"]
    loaded = runner.load(graph_json, base_json, seed) or {}
    starts = [Candidate.of_kernel(k) for k in kernels]
    # Twins (the same kernel in each repeated layer) are searched once, through their first.
    leader = _leaders(kernels, loaded.get("twins") or {})
    leads = [i for i, j in enumerate(leader) if i == j]
    copies = [leader.count(i) for i in range(len(leader))]
    if hasattr(runner, "prepare"):
        runner.prepare([starts[i] for i in leads])  # every heuristic point at once, in parallel
    errors: list[str] = []
    if loaded.get("heuristic_miss"):
        errors.append(f"heuristic build vs the aten graph: {loaded['heuristic_miss']}; candidates "
                      "are judged against the heuristic build where it misses")
    eager = runner.time_graph(None)
    heuristic = runner.time_graph(base_json)
    for label, reply in (("eager", eager), ("heuristic", heuristic)):
        if reply.get("error"):
            errors.append(f"{label}: {reply['error']}")
    clock = BudgetClock(budget)
    searches: dict[int, KernelSearch] = {}
    pruned: dict[int, int] = {}
    # Phase 1: every distinct kernel's heuristic point, timed once: the baseline and weights.
    for n, i in enumerate(leads):
        kernel, start = kernels[i], starts[i]
        if progress:
            progress(n, 2 * len(leads), kernel["name"])
        space, dropped = candidates(kernel, target)
        seeds = []
        kept = stand_in(start.variant)  # an ATen call's kept config: the template's seed
        if kept and set(kernel["config"]) == set(kinds.kind_of(kernel["kind"], kept).config_keys):
            seeds.append(Candidate.make(kernel["name"], kept, kernel["config"]))
        search = KernelSearch(space, start, runner, clock, share=0, seeds=seeds)
        search.baseline()
        searches[i] = search
        pruned[i] = len(dropped)
    # Phase 2: the rest of the budget, shared in proportion to each kernel's time (twins
    # included), slowest first; a kernel under MIN_WEIGHT of the graph's kernel time keeps
    # its heuristic config.
    weights = {i: (searches[i].baseline_ms() or 0.0) * copies[i] for i in leads}
    order = sorted(leads, key=lambda i: (-weights[i], i))
    remaining_weight = sum(weights.values()) or 1.0
    for rank, i in enumerate(order):
        search = searches[i]
        if progress:
            progress(len(leads) + rank, 2 * len(leads), kernels[i]["name"])
        fraction = weights[i] / remaining_weight if remaining_weight > 0 else 0.0
        remaining_weight -= weights[i]
        if weights[i] < MIN_WEIGHT * sum(weights.values()) or clock.exhausted():
            continue
        trials_left = clock.trials_left()
        seconds_left = None if budget.seconds is None else budget.seconds - clock.elapsed()
        search.grant(
            trials=None if trials_left is None else int(trials_left * fraction),
            seconds=None if seconds_left is None else seconds_left * fraction,
        )
        search.run(strategy)
    measurements: list[Measurement] = []
    kernel_results: list[KernelResult] = []
    changes: list[tuple[int, Candidate, str | None]] = []  # (leader, chosen, source hash)
    savings: dict[int, float] = {}  # per changed leader: ms its winner saved, twins included
    for i, kernel in enumerate(kernels):
        search, twin = searches[leader[i]], leader[i] != i
        if not twin:
            measurements.extend(search.measurements)
        winner = _winner(search)
        if winner is None and not twin:
            errors.append(_no_winner(kernel["name"], search))
        chosen = winner.candidate if winner is not None else search.start
        chosen = Candidate(kernel["name"], chosen.variant, chosen.config_items)
        if chosen.variant != kernel["variant"] or chosen.config != kernel["config"]:
            # a twin's source is its leader's; the final build fills (and checks) it
            changes.append((leader[i], chosen,
                            winner.extra.get("source_hash") if winner else None))
            if not twin and winner is not None:
                savings[i] = ((search.baseline_ms() or winner.ms) - winner.ms) * copies[i]
        kernel_results.append(
            KernelResult(
                name=kernel["name"],
                kind=kernel["kind"],
                heuristic=starts[i],
                winner=chosen,
                heuristic_ms=search.baseline_ms(),
                tuned_ms=winner.ms if winner is not None else None,
                strategy=search.strategy,
                space=len(search.space),
                pruned=pruned[leader[i]],
                trials=0 if twin else search.spent,
                twin_of=kernels[leader[i]]["name"] if twin else None,
            )
        )
    if progress:
        progress(2 * len(leads), 2 * len(leads), "")
    tuned = _with_changes(base, changes, {leader for leader, _, _ in changes})
    final, heuristic = _paired_times(runner, tuned, base, heuristic)
    if final.get("error") or final.get("ms") is None:
        errors.append(f"tuned schedule: {final.get('error')}; keeping the heuristic configs")
        final = heuristic
        tuned = base
    elif tuned.kernels != base.kernels and heuristic.get("ms") and \
            final["ms"] > heuristic["ms"] * (1 + REGRESSION_MARGIN):
        # Kernels won in isolation but the whole graph got slower: trust the whole graph,
        # and try the largest measured gains alone before giving them all up.
        slower = f"tuned graph {final['ms']:.4g} ms slower than heuristic {heuristic['ms']:.4g} ms"
        backed = _back_off(runner, base, changes, savings, heuristic)
        if backed is None:
            errors.append(f"{slower}; keeping the heuristic configs")
            final, tuned = heuristic, base
        else:
            final, heuristic, tuned, kept = backed
            errors.append(f"{slower}; kept the {kept} largest measured gains of {len(savings)} "
                          f"kernels: {final['ms']:.4g} ms against {heuristic['ms']:.4g} ms")
    # The child's copy has every source hash filled in; JSON only across that boundary.
    schedule = compiler.Schedule.from_json(final["schedule"]) if final.get("schedule") else tuned
    return TuningResult(
        schedule=replace(schedule, status="tuned"),
        measurements=[m.to_json() for m in measurements],
        eager_ms=eager.get("ms"),
        heuristic_ms=heuristic.get("ms"),
        best_ms=final.get("ms"),
        trials=clock.used,
        seconds=time.monotonic() - started,
        kernels=kernel_results,
        errors=errors,
        device=loaded.get("device"),
    )
