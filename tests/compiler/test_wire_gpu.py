"""The corpus traced on a GPU round-trips too, and its graphs run on the CPU via to_fx(device=...).

CPU twin: tests/compiler/test_wire_roundtrip.py (same corpus, traced on the CPU).
"""

from __future__ import annotations

import json

import pytest
import torch

from compiler import from_wire, graph_hash, random_inputs, to_wire
from tests.corpus import corpus

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_corpus_round_trips_and_runs_on_cpu() -> None:
    for c in corpus("cuda"):
        wire = to_wire(c.gm, c.example_inputs)
        graph = from_wire(json.dumps(wire))
        assert to_wire(graph.to_fx(), c.example_inputs) == wire, c.name
        inputs = random_inputs(graph, seed=1, device="cuda")
        torch.manual_seed(0)
        expected = c.gm(*inputs)
        torch.manual_seed(0)
        actual = graph.to_fx()(*inputs)
        for x, y in zip(expected, actual, strict=True):
            # Only floating outputs: efficient attention also returns philox seed/offset
            # tensors that hold uninitialised memory when dropout is off.
            if x is not None and x.is_floating_point():
                assert torch.allclose(x, y, rtol=0, atol=0, equal_nan=True), c.name
        # CUDA-only attention kernels have no CPU twin; dropout draws differ per device; max-pool
        # backward treats random (out-of-window) indices differently on each device.
        if not any(k in op for op in graph.op_summary() for k in ("scaled_dot_product", "dropout", "max_pool")):
            cpu_out = graph.to_fx(device="cpu")(*[t.cpu() for t in inputs])
            for x, y in zip(expected, cpu_out, strict=True):
                assert (x is None and y is None) or torch.allclose(x.cpu(), y, rtol=1e-3, atol=1e-3, equal_nan=True), c.name


def test_cuda_graph_hash_ignores_device_index() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    hashes = set()
    for index in (0, 1):
        with torch.cuda.device(index):
            gm_case = corpus(f"cuda:{index}")[0]
            hashes.add(graph_hash(to_wire(gm_case.gm, gm_case.example_inputs)))
    assert len(hashes) == 1
