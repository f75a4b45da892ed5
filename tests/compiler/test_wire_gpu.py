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
            assert (x is None and y is None) or torch.equal(x, y), c.name
        if "dropout" not in json.dumps(graph.op_summary()) and "flash" not in json.dumps(graph.op_summary()):
            cpu_out = graph.to_fx(device="cpu")(*[t.cpu() for t in inputs])
            for x, y in zip(expected, cpu_out, strict=True):
                assert (x is None and y is None) or torch.allclose(x.cpu(), y, rtol=1e-3, atol=1e-3), c.name


def test_cuda_graph_hash_ignores_device_index() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    hashes = set()
    for index in (0, 1):
        with torch.cuda.device(index):
            gm_case = corpus(f"cuda:{index}")[0]
            hashes.add(graph_hash(to_wire(gm_case.gm, gm_case.example_inputs)))
    assert len(hashes) == 1
