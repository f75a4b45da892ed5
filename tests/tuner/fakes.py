"""A fake measurer for strategy tests: times come from a formula, failures from a rule."""

from __future__ import annotations

from collections.abc import Callable

from tuner.records import CRASH, Candidate, Measurement


class FakeRunner:
    """Measures candidates with `cost(candidate)` ms; `fails(candidate)` gives an error or None."""

    def __init__(
        self,
        cost: Callable[[Candidate], float],
        fails: Callable[[Candidate], str | None] = lambda c: None,
        noise: float = 0.0,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.cost, self.fails, self.noise, self.tick = cost, fails, noise, tick
        self.calls: list[tuple[Candidate, float]] = []

    def measure(self, candidates: list[Candidate], fidelity: float = 1.0) -> list[Measurement]:
        out = []
        for cand in candidates:
            self.calls.append((cand, fidelity))
            if self.tick:
                self.tick()
            error = self.fails(cand)
            if error:
                out.append(Measurement(cand, error=error))
            else:
                out.append(Measurement(cand, ms=self.cost(cand), verified=True, noise=self.noise))
        return out


def crash_on_big_xblock(cand: Candidate) -> str | None:
    return f"{CRASH}: child died" if cand.config.get("XBLOCK", 0) >= 2048 else None
