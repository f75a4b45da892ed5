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


class FakeGraphRunner(FakeRunner):
    """A FakeRunner that also answers the graph-level requests `tune()` makes."""

    def __init__(self, cost: Callable[[Candidate], float], **kw) -> None:
        super().__init__(cost, **kw)
        self.loaded: dict | None = None

    def load(self, graph_json: dict, schedule_json: dict, seed: int = 0) -> None:
        self.loaded = schedule_json

    def time_graph(self, schedule_json: dict | None, fidelity: float = 1.0) -> dict:
        if schedule_json is None:
            return {"ms": 10.0, "error": None}
        total = sum(
            self.cost(Candidate.make(k["name"], k["variant"], k["config"]))
            for k in schedule_json["kernels"]
        )
        return {"ms": total, "error": None}


def matmul_kernel(M: int = 4096, N: int = 4096, K: int = 4096, dtype: str = "bfloat16",
                  variant: str = "triton") -> dict:
    """A schedule entry for one matmul kernel, as the search space reads it."""
    return {
        "name": "mm_0",
        "kind": "matmul",
        "variant": variant,
        "sizes": {"M": M, "N": N, "K": K, "batch": 1},
        "dtype": dtype,
        "config": {
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "BLOCK_K": 32,
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 3,
        },
    }
