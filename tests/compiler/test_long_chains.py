"""Long chains of ops build: code generation and fusion have no recursion depth limit
(issue 15, point 5: a fused chain of about 200 pointwise ops hit a RecursionError)."""

from __future__ import annotations

import sys

import torch

import compiler
from tests.compiler.oputil import assert_matches, rand, trace


def _chain(n: int):
    def fn(x: torch.Tensor) -> torch.Tensor:
        for i in range(n):
            x = x * 1.0001 + 0.5 if i % 2 else torch.relu(x - 0.1)
        return x
    return fn


def _build_and_run(fn, x: torch.Tensor) -> compiler.Built:
    graph = compiler.from_wire(compiler.to_wire(trace(fn, x), [x]))
    built = compiler.build(graph, compiler.heuristic_schedule(graph, compiler.Target.detect("cpu")))
    assert_matches(built(x), fn(x), (1e-4, 1e-4))
    return built


def test_pointwise_chain_far_past_the_recursion_limit_builds_as_one_kernel():
    x = rand((4, 8))
    fn = _chain(sys.getrecursionlimit())  # 1.5x as many aten ops as the recursion limit
    built = _build_and_run(fn, x)
    assert len(built.kernels) == 1 and built.fallback_ops == []


def test_reductions_over_long_inlined_chains_build():
    chain = _chain(sys.getrecursionlimit() // 2)

    def fn(x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):  # each reduction reads a chain of recursion-limit length
            x = chain(x)
            x = x - x.mean(-1, keepdim=True)
        return x

    built = _build_and_run(fn, rand((4, 8)))
    assert built.fallback_ops == []


def test_deep_chain_source_is_deterministic():
    x = rand((4, 8))
    gm = trace(_chain(300), x)
    graph = compiler.from_wire(compiler.to_wire(gm, [x]))
    schedule = compiler.heuristic_schedule(graph, compiler.Target.detect("cpu"))
    first = [k.source for k in compiler.build(graph, schedule).kernels]
    assert first == [k.source for k in compiler.build(graph, schedule).kernels]
