"""The foundations corpus (inference, training forward and backward), through the wire
format, built with heuristic schedules, equal to eager; only library-call ops fall back."""

from __future__ import annotations

import pytest
import torch

import compiler
from compiler.lowering import ops
from tests.compiler.oputil import assert_matches
from tests.corpus import case, case_names

# Ops that stay ATen calls by design (convolutions, attention, pooling with indices,
# scatter-style writes, random ops): never a pointwise op, reduction or matmul.
LIBRARY_KINDS = ("convolution", "scaled_dot_product", "pool", "embedding_dense_backward",
                 "scatter", "index_put", "dropout", "bernoulli", "rand")


@pytest.mark.parametrize("name", case_names())
def test_corpus_case_matches_eager(name: str) -> None:
    c = case(name)
    graph = compiler.from_wire(compiler.to_wire(c.gm, c.example_inputs))
    target = compiler.Target.detect("cpu")
    built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
    built.poison = True
    torch.manual_seed(1234)  # random ops (dropout) draw the same numbers in both runs
    got = built(*c.example_inputs)
    torch.manual_seed(1234)
    want = graph.to_fx()(*c.example_inputs)
    assert_matches(got, want, (2e-5, 2e-5))
    for op in built.fallback_ops:
        base = op.split(".")[1]
        assert base not in ops.POINTWISE | ops.REDUCTIONS | ops.MATMULS, op
        assert any(kind in op for kind in LIBRARY_KINDS), f"unexpected ATen call {op}"
    assert built.kernels
