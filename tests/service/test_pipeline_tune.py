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
