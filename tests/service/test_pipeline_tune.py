"""The GPU worker's tune step, run on the CPU (Triton interpreter): what it stores per kernel."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.xdist_group("tuner_runner")


def test_a_twin_kernel_gets_the_tuned_time_of_the_kernel_measured_for_it() -> None:
    import compiler
    from compiler.lowering.tracing import trace_inference
    from service.pipeline import tune

    gm, ins = trace_inference(lambda x, w1, w2: torch.relu(torch.relu(x @ w1) @ w2),
                              [torch.randn(16, 32), torch.randn(32, 32), torch.randn(32, 32)])
    wire = json.dumps(compiler.to_wire(gm, ins))
    out = tune(wire, compiler.Target.detect("cpu").to_json(), trials=4, seconds=300, device="cpu")
    first, second = out.kernels
    assert {m["kernel"] for m in out.measurements} == {first["name"]}
    assert first["source_hash"] == second["source_hash"]
    assert first["tuned_ms"] is not None and second["tuned_ms"] == first["tuned_ms"]


def test_a_tuned_cuda_schedule_comes_with_its_kernels_compiled_for_the_target(monkeypatch) -> None:
    """The GPU worker's tune step compiles the tuned schedule's kernels for the target, as
    the CPU worker does the heuristic one: compile facts and one binary per distinct kernel
    (here the tuner is a stand-in that returns the heuristic schedule as tuned)."""
    import dataclasses
    from types import SimpleNamespace

    import compiler
    import tuner
    from compiler.lowering.tracing import trace_inference
    from service.pipeline import tune

    gm, ins = trace_inference(lambda x, w1, w2: torch.relu(torch.relu(x @ w1) @ w2),
                              [torch.randn(16, 32), torch.randn(32, 32), torch.randn(32, 32)])
    wire = compiler.to_wire(gm, ins)
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    schedule = dataclasses.replace(compiler.heuristic_schedule(compiler.from_wire(wire), target),
                                   status="tuned")
    monkeypatch.setattr(tuner, "tune", lambda *_a, **_k: SimpleNamespace(
        schedule=schedule, measurements=[], eager_ms=1.0, heuristic_ms=1.0, best_ms=1.0,
        errors=[], kernels=[], seconds=0.1))
    out = tune(json.dumps(wire), target.to_json(), trials=1, seconds=1)
    assert all(k["compiled"]["arch"] == "sm_90" for k in out.kernels)
    assert [b["source_hash"] for b in out.binaries] == [out.kernels[0]["source_hash"]]  # twins: one
    assert sorted(n.rsplit(".", 1)[1] for n in out.binaries[0]["files"]) == ["cubin", "json"]


def test_the_job_note_counts_the_kernels_whose_config_tuning_changed() -> None:
    from types import SimpleNamespace

    from service.pipeline import _changed_kernels
    from tuner.records import Candidate

    def kernel(name: str, variant: str, **config: int) -> SimpleNamespace:
        return SimpleNamespace(name=name, variant=variant, config=config)

    def searched(name: str, variant: str, **config: int) -> SimpleNamespace:
        return SimpleNamespace(name=name, heuristic=Candidate.make(name, variant, config))

    searches = [searched("a", "looped", XBLOCK=16), searched("b", "persistent", XBLOCK=1),
                searched("c", "triton", BLOCK_M=64)]
    kept = SimpleNamespace(kernels=searches, schedule=SimpleNamespace(kernels=[
        kernel("a", "looped", XBLOCK=16), kernel("b", "persistent", XBLOCK=1),
        kernel("c", "triton", BLOCK_M=64)]))
    assert _changed_kernels(kept) == 0  # "tuned", yet every heuristic config kept
    tuned = SimpleNamespace(kernels=searches, schedule=SimpleNamespace(kernels=[
        kernel("a", "looped", XBLOCK=32), kernel("b", "looped", XBLOCK=1),
        kernel("c", "triton", BLOCK_M=64)]))
    assert _changed_kernels(tuned) == 2
