"""The builder: compile a batch of candidates in parallel before the runner times them.

Workers are spawned processes. Per candidate a worker builds the schedule with that
kernel's variant and config (codegen, config validation), then compiles that kernel:
on a GPU through Triton's JIT `warmup`, which specialises exactly as the runner's launch
will, so the binary lands in the shared Triton cache and the runner's first launch is a
hit; on a machine without a GPU ahead of time for the target (`tuner.aot`), which is what
a CPU worker can do for an sm_90 target. Build errors and out-of-resources come back here,
before the runner spends a request on them. Timing stays serial in the runner; only
compiling fans out. The interpreter (CPU target) compiles nothing.
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

# Exceptions that condemn the candidate itself (Triton could not compile or fit it).
VERDICT_ERRORS = ("CompilationError", "OutOfResources", "PTXASError", "MLIRCompilationError")

_graphs: dict[str, tuple[Any, Any]] = {}  # key -> (compiler.Graph, compiler.Schedule), per worker


def _init_worker(device: str) -> None:
    if device == "cpu":
        # Ahead-of-time compiles need Triton imported with the interpreter off: under it,
        # triton.language's own @jit helpers (tl.max, tl.sum) are interpreted functions.
        os.environ["TRITON_INTERPRET"] = "0"
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))


def _warm(device: str) -> None:
    """Pay the imports (and the CUDA context) before the first batch arrives."""
    import triton  # noqa: F401

    import compiler  # noqa: F401

    if device.startswith("cuda"):
        import torch

        torch.zeros(1, device=device)


def _compile_one(
    device: str, key: str, loaded: tuple[dict, dict, int], cand_json: dict, target_json: dict
) -> dict:
    """Build the candidate and compile its kernel: JIT warm-up on a GPU (fills the cache the
    runner reads), ahead-of-time for the target elsewhere. An error string or None."""
    import compiler
    from tuner.aot import compile_kernel, warm_kernel
    from tuner.session import classify, schedule_with
    from tuner.space import limits_for

    if key not in _graphs:
        _graphs.clear()
        _graphs[key] = (compiler.from_wire(loaded[0]), compiler.Schedule.from_json(loaded[1]))
    graph, base = _graphs[key]
    cand = Candidate.from_json(cand_json)
    target = compiler.Target.from_json(target_json)
    try:
        built = compiler.build(graph, schedule_with(base, cand))
    except Exception as exc:
        return {"error": classify(exc, "build")}
    try:
        if device.startswith("cuda"):
            error = warm_kernel(built, cand.kernel, limits_for(target))
        elif target.device_type == "cuda":
            error = compile_kernel(built, cand.kernel, target)
        else:
            error = None  # the interpreter compiles nothing: building was the check
    except Exception as exc:
        verdict = classify(exc, "build")
        if type(exc).__name__ in VERDICT_ERRORS or verdict.startswith(OUT_OF_RESOURCES):
            return {"error": verdict}
        # Anything else may be this worker's problem, not the candidate's: the runner decides.
        log.warning("compile worker could not compile %s: %s", cand.label(), verdict)
        return {"error": None}
    return {"error": error}


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
        self._target_json = schedule_json.get("target") or {}
        self._key = canonical([graph_json, schedule_json, seed])
        self.verdicts.clear()
        self.prepared.clear()
        if self.workers > 0:
            # Start the workers and load the graph now, while the runner times the baseline.
            pool = self._ensure_pool()
            for _ in range(self.workers):
                pool.submit(_warm, self.device)

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
                pool.submit(
                    _compile_one,
                    self.device,
                    self._key,
                    self._loaded,
                    c.to_json(),
                    self._target_json,
                )
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


def precompile(
    graph_json: dict,
    schedule_json: dict,
    target: Any,
    candidates: list[Candidate],
    workers: int = 2,
) -> dict[Candidate, str | None]:
    """Compile candidates for a GPU target on CPU workers: each candidate's error, or None.

    This is the CPU worker's half of tuning: it needs no GPU, catches what cannot compile or
    does not fit the target's shared memory, and leaves timing to a GPU worker.
    """
    loaded = (graph_json, schedule_json, 0)
    key = canonical([graph_json, schedule_json])
    args = [("cpu", key, loaded, c.to_json(), target.to_json()) for c in candidates]
    # Always in spawned workers: a process that has run kernels in the Triton interpreter
    # has triton.language patched for it, and no longer compiles for a real GPU.
    with ProcessPoolExecutor(
        max_workers=max(1, workers), mp_context=mp.get_context("spawn"),
        initializer=_init_worker, initargs=("cpu",),
    ) as pool:
        results = list(pool.map(_compile_one, *zip(*args, strict=True)))
    return {c: r["error"] for c, r in zip(candidates, results, strict=True)}
