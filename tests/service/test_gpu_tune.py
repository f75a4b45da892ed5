"""The GPU worker's job on a real GPU: tune a corpus graph, keep every measurement, and
publish a tuned schedule whose kernels build. (The worker's database and queue handling of
this outcome is tested on the CPU in test_worker.py with the same Outcome shape.)"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tune_outcome_on_the_gpu() -> None:
    import compiler
    from service.build_child import build_in_child
    from service.pipeline import tune
    from tests.corpus import case

    c = case("embedding_ce.fwd")  # traced on the CPU: no CPU-only ops (SDPA) in it
    wire = json.dumps(compiler.to_wire(c.gm, c.example_inputs))
    target = compiler.Target.detect("cuda:0").to_json()
    heuristic = build_in_child(wire, target, 0, timeout_s=600, memory_bytes=0)
    fractions: list[float] = []
    out = tune(wire, target, trials=8, seconds=120, device="cuda:0", progress=fractions.append)
    assert fractions and fractions[-1] == 1.0
    assert out.schedule["graph_hash"] == heuristic.schedule["graph_hash"]
    # Tuning changes configs, never the fusion groups.
    assert [k["nodes"] for k in out.schedule["kernels"]] == \
        [k["nodes"] for k in heuristic.schedule["kernels"]]
    assert out.measurements and all("kernel" in m and "config" in m for m in out.measurements)
    assert any(m["verified"] and m["ms"] for m in out.measurements)
    assert out.timings["tuned_ms"] and out.timings["eager_ms"] and out.timings["tuning_s"]
    assert all(k["source_hash"] and k["source"] for k in out.kernels)
    assert any(k.get("tuned_ms") for k in out.kernels)
