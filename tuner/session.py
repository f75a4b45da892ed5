"""What the runner's child process does: build, verify and time candidates of one graph.

A `TrialSession` holds one graph on one device: the reference (seeded inputs and the aten
graph's outputs) and the base schedule (a `compiler.Schedule`; JSON only in the requests).
Each candidate is the base schedule with one kernel's variant and config replaced
(`Schedule.with_kernel`); it is built, checked against the reference, then
timed, either alone (`built.kernel_calls`, relaunching that kernel on the same buffers) or
as the whole graph. Every failure comes back as a measurement dict with a reason.
"""

from __future__ import annotations

import hashlib
import logging
import traceback
from collections import OrderedDict
from typing import Any

from tuner import records
from tuner.timing import time_fn
from tuner.verify import Reference

log = logging.getLogger(__name__)

# Built candidates kept for re-timing at a higher fidelity (successive halving).
BUILD_CACHE_SIZE = 32


class CudaFault(RuntimeError):
    """A CUDA error that may have poisoned the context: the child must restart after it."""


def classify(exc: BaseException, stage: str) -> str:
    """The measurement error string for an exception raised while building or running."""
    name = type(exc).__name__
    text = f"{name}: {exc}".strip()
    first = text.splitlines()[0][:500] if text else name
    lowered = text.lower()
    if name == "OutOfResources" or "out of resource" in lowered or "outofresources" in lowered:
        return f"{records.OUT_OF_RESOURCES}: {first}"
    if stage == "build":
        return f"{records.BUILD_ERROR}: {first}"
    return f"{records.RUN_ERROR}: {first}"


def is_cuda_fault(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "cuda error" in text or "illegal memory access" in text or "device-side assert" in text


class TrialSession:
    """One graph loaded on one device, ready to measure candidates of its kernels."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.graph: Any = None
        self.reference: Reference | None = None
        self.base: Any = None  # compiler.Schedule
        self._builds: OrderedDict[str, Any] = OrderedDict()

    # -- requests ---------------------------------------------------------------------------
    def load(self, graph_json: dict[str, Any], schedule_json: dict[str, Any], seed: int) -> dict:
        """Parse the graph, compute the reference on seeded inputs, keep the base schedule;
        the reply names each kernel's twin key (`twin_keys`)."""
        import compiler

        self.graph = compiler.from_wire(graph_json)
        self.reference = Reference.compute(self.graph, seed=seed, device=self.device)
        self.base = compiler.Schedule.from_json(schedule_json)
        self._builds.clear()
        built = None
        try:
            built = self._build(self.base)
            miss = self.reference.adopt_baseline(built)
        except Exception as exc:  # the heuristic itself fails: each candidate meets it alone
            miss = classify(exc, "build")
        if miss:
            log.warning(
                "heuristic build vs the aten graph: %s (second reference: %s)",
                miss,
                self.reference.baseline is not None,
            )
        twins: dict[str, str] = {}
        if built is not None:
            try:
                twins = twin_keys(self.graph, self.base, built)
            except Exception as exc:  # no grouping: every kernel is searched on its own
                log.warning("kernels not grouped into twins: %s", describe_exception(exc))
        return {"ok": True, "heuristic_miss": miss, "baseline": self.reference.baseline is not None,
                "twins": twins}

    def measure(self, cand_json: dict[str, Any], fidelity: float, scope: str) -> dict[str, Any]:
        """Build, verify and time one candidate; a measurement dict (with `error` on failure)."""
        cand = records.Candidate.from_json(cand_json)
        out: dict[str, Any] = {**cand.to_json(), "ms": None, "error": None, "verified": False}
        key = records.canonical(cand.to_json())
        built = self._builds.get(key)
        if built is None:
            try:
                built = self._build(schedule_with(self.base, cand))
            except Exception as exc:  # every build failure is a recorded result
                out["error"] = classify(exc, "build")
                return out
            try:
                reason = self.reference.check(built)
            except Exception as exc:
                out["error"] = classify(exc, "run")
                if is_cuda_fault(exc):
                    raise CudaFault(out["error"]) from exc
                return out
            if reason is not None:
                out["error"] = f"{records.WRONG_ANSWER}: {reason}"
                return out
            self._remember(key, built)
            out["verification"] = self.reference.rule
        out["verified"] = True
        try:
            timing, used_scope = self._time(built, cand.kernel, fidelity, scope)
        except Exception as exc:
            out["error"] = classify(exc, "run")
            if is_cuda_fault(exc):
                raise CudaFault(out["error"]) from exc
            return out
        out.update(ms=timing.median_ms, noise=timing.noise_ms, scope=used_scope)
        out["source_hash"] = _kernel_hash(built, cand.kernel)
        return out

    def time_graph(self, schedule_json: dict[str, Any] | None, fidelity: float) -> dict[str, Any]:
        """Whole-graph time: eager (the aten graph) when `schedule_json` is None, else built."""
        import torch

        import compiler

        ref = self.reference
        try:
            if schedule_json is None:
                module = self.graph.to_fx().to(ref.device)
                run = module
            else:
                run = self._build(compiler.Schedule.from_json(schedule_json))
                reason = ref.check(run)
                if reason is not None:
                    return {"ms": None, "error": f"{records.WRONG_ANSWER}: {reason}"}
            ref.restore()

            def call() -> None:
                with torch.no_grad():
                    run(*ref.inputs)

            timing = time_fn(call, self.device, fidelity)
        except Exception as exc:
            error = classify(exc, "run")
            if is_cuda_fault(exc):
                raise CudaFault(error) from exc
            return {"ms": None, "error": error}
        reply = {"ms": timing.median_ms, "noise": timing.noise_ms, "error": None}
        if schedule_json is not None:
            reply["schedule"] = run.schedule.to_json()  # source hashes filled in
        return reply

    # -- helpers ----------------------------------------------------------------------------
    def _build(self, schedule: Any) -> Any:
        import compiler

        return compiler.build(self.graph, schedule)

    def _remember(self, key: str, built: Any) -> None:
        self._builds[key] = built
        while len(self._builds) > BUILD_CACHE_SIZE:
            self._builds.popitem(last=False)

    def _time(self, built: Any, kernel: str, fidelity: float, scope: str) -> tuple[Any, str]:
        import torch

        ref = self.reference
        ref.restore()
        if scope == "kernel":
            with torch.no_grad():
                calls = [c for c in built.kernel_calls(*ref.inputs) if c.name == kernel]
            if calls:

                def launch() -> None:
                    for c in calls:
                        c.launch()

                return time_fn(launch, self.device, fidelity), "kernel"

        def whole() -> None:
            with torch.no_grad():
                built(*ref.inputs)

        return time_fn(whole, self.device, fidelity), "graph"


def schedule_with(base: Any, cand: records.Candidate, source_hash: str | None = None) -> Any:
    """`base` (a `compiler.Schedule`) with the candidate's kernel set to its variant and
    config (a kind whose config does not apply, an ATen call, keeps the schedule's) and that
    kernel's source hash set to `source_hash` (cleared by default: the build fills it)."""
    config = {"config": cand.config} if records.configurable(cand.variant) else {}
    return base.with_kernel(cand.kernel, variant=cand.variant, source_hash=source_hash, **config)


def twin_keys(graph: Any, base: Any, built: Any) -> dict[str, str]:
    """Kernel name -> twin key: kernels with one key are the same kernel at other places in
    the graph (a model's repeated layers), so every candidate builds and times the same for
    each, and one search serves them all.

    The key hashes the kernel's generated source (its shapes and strides are literals in
    it), its launch's argument dtypes, and its heuristic variant, config, sizes and dtype.
    A matmul whose heuristic is an ATen call generates only its epilogue, which says little
    about the matmul, so the key takes that kernel's Triton-template source instead."""
    import compiler

    probe = base
    for kernel in base.kernels:
        kept = records.stand_in(kernel.variant)
        if kept is not None:
            probe = probe.with_kernel(kernel.name, variant=kept, source_hash=None)
    if probe != base:
        built = compiler.build(graph, probe)
    args = {launch.kernel: [str(d) for d in launch.arg_dtypes] for launch in built.launches()}
    keys = {}
    for kernel, entry in zip(built.kernels, base.kernels, strict=True):
        ident = {"source": kernel.source_hash, "args": args.get(kernel.name), "kind": entry.kind,
                 "variant": entry.variant, "config": entry.config, "sizes": entry.sizes,
                 "dtype": entry.dtype}
        keys[entry.name] = hashlib.sha256(records.canonical(ident).encode()).hexdigest()
    return keys


def _kernel_hash(built: Any, kernel: str) -> str | None:
    for k in getattr(built, "kernels", []):
        if k.name == kernel:
            return k.source_hash
    return None


def describe_exception(exc: BaseException) -> str:
    """One log-friendly paragraph for an unexpected failure in the child."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
