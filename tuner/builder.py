"""The builder: compile a batch of candidates in parallel before the runner times them.

Each worker is a spawned process that holds the graph (seeded inputs on the device) and,
per candidate, builds the schedule with that kernel's variant and config and runs it once.
On a GPU that JIT-compiles the candidate's kernel into the shared Triton cache, with the
same specialisation the runner's launch will ask for, so the runner's first launch is a
cache hit; build errors and out-of-resources come back here, before the runner spends a
request on them. The runner stays serial (one kernel on the GPU at a time while timing);
only compiling fans out. On the CPU (Triton interpreter) there is nothing to compile and
the builder is not used.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tuner.records import OUT_OF_RESOURCES, Candidate, canonical

log = logging.getLogger(__name__)

_session: Any = None  # the worker's TrialSession for the graph it last loaded
_session_key: str | None = None


def _init_worker(device: str) -> None:
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))


def _load(device: str, key: str, loaded: tuple[dict, dict, int]) -> None:
    """Hold the graph `key` in this worker (the pool outlives graphs: load on first sight)."""
    global _session, _session_key
    from tuner.session import TrialSession

    if _session_key != key:
        _session = None  # free the previous graph's buffers first
        session = TrialSession(device)
        session.load(*loaded)
        _session, _session_key = session, key


def _compile_one(device: str, key: str, loaded: tuple[dict, dict, int], cand_json: dict) -> dict:
    """Build the candidate and run it once (compiling its kernels); an error string or None."""
    from tuner.session import classify

    _load(device, key, loaded)
    cand = Candidate.from_json(cand_json)
    try:
        built = _session._build(_session._schedule_with(cand))
    except Exception as exc:
        return {"error": classify(exc, "build")}
    try:
        _session.reference.restore()
        built(*_session.reference.inputs)
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
    except Exception as exc:
        error = classify(exc, "run")
        # Only compile-time verdicts are final here; run errors are the runner's to record.
        return {"error": error if error.startswith(OUT_OF_RESOURCES) else None}
    return {"error": None}


def default_workers(device: str) -> int:
    """Parallel compile workers for a device: none on the CPU (interpreter), else the cores."""
    if not device.startswith("cuda"):
        return 0
    return max(1, min(16, (os.cpu_count() or 2) - 2))


class Builder:
    """A pool of spawned compile workers for one graph on one device."""

    def __init__(self, device: str, workers: int | None = None) -> None:
        self.device = device
        self.workers = default_workers(device) if workers is None else workers
        self._pool: ProcessPoolExecutor | None = None
        self._loaded: tuple[dict, dict, int] | None = None
        self._key = ""
        self.verdicts: dict[Candidate, str] = {}  # candidate -> build error found here
        self.prepared: set[Candidate] = set()

    def load(self, graph_json: dict, schedule_json: dict, seed: int = 0) -> None:
        """Set the graph the workers build; the pool itself lives on across graphs."""
        self._loaded = (graph_json, schedule_json, seed)
        self._key = canonical([graph_json, schedule_json, seed])
        self.verdicts.clear()
        self.prepared.clear()
        if self.workers > 0:
            # Start the workers and load the graph now, while the runner times the baseline.
            pool = self._ensure_pool()
            for _ in range(self.workers):
                pool.submit(_load, self.device, self._key, self._loaded)

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=mp.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.device,),
            )
        return self._pool

    def prepare(self, candidates: list[Candidate]) -> dict[Candidate, str]:
        """Compile the not yet prepared candidates in parallel; the build errors found."""
        todo = [c for c in candidates if c not in self.prepared]
        if self.workers <= 0 or len(todo) == 0 or self._loaded is None:
            return {}
        found: dict[Candidate, str] = {}
        try:
            pool = self._ensure_pool()
            futures = [
                pool.submit(_compile_one, self.device, self._key, self._loaded, c.to_json())
                for c in todo
            ]
            results = [f.result() for f in futures]
        except BrokenProcessPool as exc:
            # A compile crashed a worker: let the runner meet each candidate on its own.
            log.warning("a compile worker died (%s); the runner will measure these itself", exc)
            self.close()
            return {}
        except Exception as exc:  # loading the graph in a worker failed: compile serially
            log.warning("parallel compile failed (%s); the runner compiles instead", exc)
            return {}
        for cand, result in zip(todo, results, strict=True):
            self.prepared.add(cand)
            if result["error"]:
                found[cand] = result["error"]
        self.verdicts.update(found)
        return found

    def close(self) -> None:
        """Stop the workers."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
