"""Search strategies over one kernel's pruned space, and the winner rule.

Strategies only see a `Measurer` (candidates in, measurements out), so they run the same
on a real runner and on the fake one in tests. The budget (trials and/or seconds) is one
clock shared by every kernel of a graph. The winner is the fastest verified candidate
within the noise band, ties broken by the candidates' fixed order, so two workers timing
the same graph pick the same schedule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tuner.records import Candidate, Measurement, configurable, library_call
from tuner.space import neighbours
from tuner.timing import MIN_NOISE_FRACTION

log = logging.getLogger(__name__)

# A pruned space this small (and within the kernel's share of the budget) is searched whole.
EXHAUSTIVE_LIMIT = 24
HALVING_ETA = 3


class Measurer(Protocol):
    """Anything that turns candidates into measurements (the runner, or a fake in tests)."""

    def measure(self, candidates: list[Candidate], fidelity: float = 1.0) -> list[Measurement]: ...


@dataclass(frozen=True)
class Budget:
    """How much tuning one graph may spend: trials, seconds, or both (None = unbounded)."""

    trials: int | None = None
    seconds: float | None = None

    @classmethod
    def of(cls, budget: Budget | int | None) -> Budget:
        """Accept a Budget, an int (trials) or None (the default budget)."""
        if budget is None:
            return cls(trials=200)
        if isinstance(budget, Budget):
            return budget
        if isinstance(budget, int) and not isinstance(budget, bool):
            if budget < 1:
                raise ValueError(f"budget must be at least one trial, got {budget}")
            return cls(trials=budget)
        raise TypeError(
            f"budget must be tuner.Budget or an int (trials), got {type(budget).__name__}"
        )


@dataclass
class BudgetClock:
    """The budget as it is spent: trials counted, seconds measured from the start."""

    budget: Budget
    clock: Callable[[], float] = time.monotonic
    used: int = 0
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def trials_left(self) -> int | None:
        return None if self.budget.trials is None else max(0, self.budget.trials - self.used)

    def exhausted(self) -> bool:
        if self.budget.trials is not None and self.used >= self.budget.trials:
            return True
        return self.budget.seconds is not None and self.elapsed() >= self.budget.seconds

    def grant(self, wanted: int, share: int | None = None) -> int:
        """How many of `wanted` trials may run now (within this kernel's `share`)."""
        if self.exhausted():
            return 0
        n = wanted
        left = self.trials_left()
        if left is not None:
            n = min(n, left)
        if share is not None:
            n = min(n, share)
        return max(0, n)


def pick_winner(measurements: list[Measurement]) -> Measurement | None:
    """Fastest verified measurement within the noise band; ties go to the first in fixed order.

    A candidate measured several times counts with its highest-fidelity measurement.
    """
    best_of: dict[Candidate, Measurement] = {}
    for m in measurements:
        if not m.ok:
            continue
        seen = best_of.get(m.candidate)
        if seen is None or m.extra.get("fidelity", 1.0) >= seen.extra.get("fidelity", 1.0):
            best_of[m.candidate] = m
    if not best_of:
        return None
    fastest = min(best_of.values(), key=lambda m: (m.ms, m.candidate.order_key()))
    band = max(MIN_NOISE_FRACTION, fastest.noise / fastest.ms if fastest.ms else 0.0)
    tied = [m for m in best_of.values() if m.ms <= fastest.ms * (1 + band)]
    return min(tied, key=lambda m: m.candidate.order_key())


class KernelSearch:
    """Searches one kernel's space with a measurer, spending from a shared budget clock."""

    def __init__(
        self,
        space: list[Candidate],
        start: Candidate,
        measurer: Measurer,
        clock: BudgetClock,
        share: int | None = None,
        seconds: float | None = None,
        seeds: list[Candidate] | None = None,
    ) -> None:
        if start not in space:
            space = sorted([*space, start], key=Candidate.order_key)
        self.space, self.start, self.measurer = space, start, measurer
        # Extra starting points (the Triton config of a matmul whose heuristic is ATen).
        members = set(space)
        self.seeds = [c for c in (seeds or []) if c in members]
        self.clock, self.share, self.seconds = clock, share, seconds
        self._started = clock.elapsed()
        self.measurements: list[Measurement] = []
        self.spent = 0
        self.strategy = "baseline"

    # -- budget -----------------------------------------------------------------------------
    def grant(self, trials: int | None, seconds: float | None) -> None:
        """Give this kernel `trials` more trials and `seconds` more seconds, from now."""
        self.share = None if trials is None else self.spent + max(0, trials)
        self.seconds = seconds
        self._started = self.clock.elapsed()

    def baseline(self) -> None:
        """Time the start point once at full fidelity (outside this kernel's share)."""
        share, self.share = self.share, None
        if self.start not in self._measured():
            self._measure([self.start])
        self.share = share

    def baseline_ms(self) -> float | None:
        """The start point's full-fidelity time, when it ran and verified."""
        return next(
            (
                m.ms
                for m in self.measurements
                if m.candidate == self.start and m.ok and m.extra.get("fidelity", 1.0) == 1.0
            ),
            None,
        )

    # -- plumbing ---------------------------------------------------------------------------
    def _room(self) -> int | None:
        return None if self.share is None else max(0, self.share - self.spent)

    def _out_of_time(self) -> bool:
        return self.seconds is not None and self.clock.elapsed() - self._started >= self.seconds

    def _measure(self, batch: list[Candidate], fidelity: float = 1.0) -> list[Measurement]:
        n = self.clock.grant(len(batch), self._room())
        got: list[Measurement] = []
        prepare = getattr(self.measurer, "prepare", None)
        if prepare is not None and n > 1:
            prepare(batch[:n])  # compile the batch in parallel; timing stays one at a time
        # One at a time, so a seconds budget stops the batch as soon as it runs out.
        for cand in batch[:n]:
            if got and (self.clock.exhausted() or self._out_of_time()):
                break
            for m in self.measurer.measure([cand], fidelity):
                m.extra.setdefault("fidelity", fidelity)
                got.append(m)
                self.clock.used += 1
                self.spent += 1
        self.measurements.extend(got)
        return got

    def _measured(self) -> set[Candidate]:
        return {m.candidate for m in self.measurements}

    # -- strategies -------------------------------------------------------------------------
    def exhaustive(self) -> Measurement | None:
        """Every candidate, the start first, then the fixed order."""
        seen = self._measured()
        order = [self.start] + [c for c in self.space if c != self.start]
        self._measure([c for c in order if c not in seen])
        return pick_winner(self.measurements)

    def coordinate_descent(self) -> Measurement | None:
        """From the start, move to the best one-step neighbour until none is better."""
        if self.start not in self._measured():
            self._measure([self.start])
        current = self._descent_origin()
        while not (self.clock.exhausted() or self._out_of_time()) and self._room() != 0:
            seen = self._measured()
            step = [c for c in neighbours(current, self.space) if c not in seen]
            if not step:
                break
            self._measure(step)
            winner = pick_winner(self.measurements)
            if winner is None or winner.candidate == current:
                break
            if not configurable(winner.candidate.variant):  # no config to walk: keep walking Triton
                origin = self._descent_origin()
                if origin == current:
                    break
                current = origin
                continue
            current = winner.candidate
        return pick_winner(self.measurements)

    def _descent_origin(self) -> Candidate:
        """Where to walk from: the best candidate so far that has a config to change."""
        ok = [m for m in self.measurements if m.ok and configurable(m.candidate.variant)]
        if ok:
            best = pick_winner(ok)
            if best is not None:
                return best.candidate
        walkable = [c for c in [self.start, *self.seeds] if configurable(c.variant)]
        return walkable[0] if walkable else self.start

    def successive_halving(self, population: int | None = None) -> Measurement | None:
        """Time an evenly spread population briefly, keep the best third at triple the repeats."""
        room = self._room()
        left = self.clock.trials_left()
        limits = [x for x in (population, room, left) if x is not None]
        per_trial = [m.extra["seconds"] for m in self.measurements if "seconds" in m.extra]
        if self.seconds is not None and per_trial:
            # Only a time budget: size rung one by how long a trial has taken so far.
            remaining = self.seconds - (self.clock.elapsed() - self._started)
            limits.append(max(1, int(remaining / max(1e-3, sum(per_trial) / len(per_trial)))))
        # Rungs after the first cost about half the first: spend two thirds on rung one.
        size = min(len(self.space), max(1, (2 * min(limits)) // 3)) if limits else len(self.space)
        stride = max(1, len(self.space) // max(1, size))
        pool = [self.start] + [c for c in self.space[::stride] if c != self.start]
        pool = pool[:size]
        rungs = (1.0 / HALVING_ETA**2, 1.0 / HALVING_ETA, 1.0)
        for rung, fidelity in enumerate(rungs):
            got = self._measure(pool, fidelity)
            ok = sorted((m for m in got if m.ok), key=lambda m: (m.ms, m.candidate.order_key()))
            if not ok:
                break
            if len(ok) == 1 and rung < len(rungs) - 1:
                pool = [ok[0].candidate]  # a lone survivor still gets its full-fidelity time
                continue
            pool = [m.candidate for m in ok[: max(1, len(ok) // HALVING_ETA)]]
        final = [m for m in self.measurements if m.ok and m.extra.get("fidelity") == 1.0]
        return pick_winner(final) if final else pick_winner(self.measurements)

    def run(self, strategy: str = "auto") -> Measurement | None:
        """Search with `strategy` (auto | exhaustive | coordinate | halving); the winner or None."""
        if strategy == "auto":
            room = self._room()
            fits = room is None or len(self.space) <= room
            # Coordinate descent from the heuristic point makes the most of a few trials;
            # successive halving (by request) samples wide spaces given many.
            strategy = (
                "exhaustive" if len(self.space) <= EXHAUSTIVE_LIMIT and fits else "coordinate"
            )
        log.debug("kernel %s: %s over %d candidates", self.start.kernel, strategy, len(self.space))
        self.strategy = strategy
        # The heuristic point always gets a full-fidelity time: the baseline tables report.
        self.baseline()
        # A matmul's ATen call (cuBLAS) is the bar any Triton config must clear: time it early.
        aten = [c for c in self.space if library_call(c.variant) and c not in self._measured()]
        self._measure(aten + [c for c in self.seeds if c not in self._measured()])
        if strategy == "exhaustive":
            return self.exhaustive()
        if strategy == "coordinate":
            return self.coordinate_descent()
        if strategy == "halving":
            return self.successive_halving()
        raise ValueError(
            f"unknown search strategy {strategy!r}: use auto, exhaustive, coordinate or halving"
        )
