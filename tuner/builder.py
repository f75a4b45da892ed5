"""The builder: compile a batch of candidates in parallel before the runner times them.

Workers are spawned processes (`compiler.child.spawn`), each serving one request at a time:
the graph travels to a worker once, with its first candidate of that graph. Per candidate a worker builds the schedule with that
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
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from compiler import child
from tuner.records import OUT_OF_RESOURCES, Candidate, canonical

log = logging.getLogger(__name__)

# Exceptions that condemn the candidate itself (Triton could not compile or fit it).
VERDICT_ERRORS = ("CompilationError", "OutOfResources", "PTXASError", "MLIRCompilationError")

COMPILE_TIMEOUT_S = 600.0  # one candidate; past it the workers are stopped and the runner compiles
_graphs: dict[str, tuple[Any, Any]] = {}  # key -> (compiler.Graph, compiler.Schedule), per worker


def _worker_main(channel: child.Channel, device: str) -> None:
    """A compile worker: pay the imports (and the CUDA context) before the first batch
    arrives, then answer `{"key", "candidate", "target"[, "loaded"]}` requests with
    `_compile_one`'s result, or `{"failed": why}` when the graph itself cannot be loaded."""
    import triton  # noqa: F401

    import compiler

    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))
        torch.zeros(1, device=device)
    while True:
        request = channel.recv()
        try:
            if "loaded" in request:
                graph_json, schedule_json, _seed = request["loaded"]
                _graphs.clear()
                _graphs[request["key"]] = (compiler.from_wire(graph_json),
                                           compiler.Schedule.from_json(schedule_json))
            reply = _compile_one(device, request["key"], request["candidate"], request["target"])
        except Exception as exc:  # noqa: BLE001 - the parent compiles serially instead
            reply = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
        channel.send(reply)


def _compile_one(device: str, key: str, cand_json: dict, target_json: dict) -> dict:
    """Build the candidate and compile its kernel: JIT warm-up on a GPU (fills the cache the
    runner reads), ahead-of-time for the target elsewhere. An error string or None."""
    import compiler
    from tuner.aot import compile_kernel, warm_kernel
    from tuner.session import classify, schedule_with
    from tuner.space import limits_for

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
    """Spawned compile workers for one graph on one device."""

    def __init__(self, device: str, workers: int | None = None) -> None:
        self.device = device
        self.workers = default_workers(device) if workers is None else workers
        self._procs: list[child.Child] = []
        self._keys: list[str] = []  # the graph each worker holds
        self._loaded: tuple[dict, dict, int] | None = None
        self._target_json: dict = {}
        self._key = ""
        self.verdicts: dict[Candidate, str] = {}  # candidate -> build error found here
        self.prepared: set[Candidate] = set()

    def load(self, graph_json: dict, schedule_json: dict, seed: int = 0) -> None:
        """Set the graph the workers build; the workers themselves live on across graphs."""
        self._loaded = (graph_json, schedule_json, seed)
        self._target_json = schedule_json.get("target") or {}
        self._key = canonical([graph_json, schedule_json, seed])
        self.verdicts.clear()
        self.prepared.clear()
        if self.workers > 0:
            self._ensure_workers()  # they import while the runner times the baseline

    def _ensure_workers(self) -> None:
        if not self._procs:
            # Ahead-of-time compiles need Triton imported with the interpreter off: under it,
            # triton.language's own @jit helpers (tl.max, tl.sum) are interpreted functions.
            self._procs = [child.spawn("tuner.builder:_worker_main", [self.device],
                                       name="tuner compile worker", env={"TRITON_INTERPRET": "0"})
                           for _ in range(self.workers)]
            self._keys = [""] * self.workers

    def prepare(self, candidates: list[Candidate]) -> dict[Candidate, str]:
        """Compile the not yet prepared candidates in parallel; the build errors found."""
        todo = [c for c in candidates if c not in self.prepared]
        if self.workers <= 0 or len(todo) == 0 or self._loaded is None:
            return {}
        found: dict[Candidate, str] = {}
        try:
            results = self._compile_all(todo)
        except child.ChildError as exc:
            # A compile crashed or hung a worker: let the runner meet each candidate on its own.
            log.warning("a compile worker died (%s); the runner will measure these itself", exc)
            self.close()
            return {}
        except RuntimeError as exc:  # loading the graph in a worker failed: compile serially
            log.warning("parallel compile failed (%s); the runner compiles instead", exc)
            return {}
        for cand, result in zip(todo, results, strict=True):
            self.prepared.add(cand)
            if result["error"]:
                found[cand] = result["error"]
        self.verdicts.update(found)
        return found

    def _compile_all(self, todo: list[Candidate]) -> list[dict]:
        """`_compile_one`'s result for each candidate, the workers taking them in turn."""
        self._ensure_workers()
        results: list[dict] = [{} for _ in todo]
        pending = list(range(len(todo)))
        lock = threading.Lock()

        def serve(worker: int) -> None:
            proc = self._procs[worker]
            while True:
                with lock:
                    if not pending:
                        return
                    index = pending.pop(0)
                request = {"key": self._key, "candidate": todo[index].to_json(),
                           "target": self._target_json}
                if self._keys[worker] != self._key:
                    request["loaded"] = self._loaded
                    self._keys[worker] = self._key
                proc.send(request)
                results[index] = proc.recv(COMPILE_TIMEOUT_S)
                if "failed" in results[index]:
                    self._keys[worker] = ""
                    raise RuntimeError(results[index]["failed"])

        with ThreadPoolExecutor(len(self._procs)) as pool:
            for done in [pool.submit(serve, w) for w in range(len(self._procs))]:
                done.result()
        return results

    def close(self) -> None:
        """Stop the workers."""
        procs, self._procs, self._keys = self._procs, [], []
        for proc in procs:
            proc.close(grace_s=5)


def precompile(
    graph_json: dict,
    schedule_json: dict,
    target: Any,
    candidates: list[Candidate],
    workers: int = 2,
) -> dict[Candidate, str | None]:
    """Compile candidates for a GPU target on CPU workers: each candidate's error, or None.

    This is the CPU worker's half of tuning: it needs no GPU, catches what cannot compile or
    does not fit the target's shared memory, and leaves timing to a GPU worker. Always in
    spawned workers: a process that has run kernels in the Triton interpreter has
    triton.language patched for it, and no longer compiles for a real GPU.
    """
    builder = Builder("cpu", max(1, workers))
    try:
        builder.load(graph_json, schedule_json)
        builder._target_json = target.to_json()
        results = builder._compile_all(candidates)
    finally:
        builder.close()
    return {c: r["error"] for c, r in zip(candidates, results, strict=True)}
