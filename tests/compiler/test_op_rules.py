"""The op registry: one entry per op, the op sets read from it, and a rule's bug is an error
(never a silent ATen call)."""

from __future__ import annotations

import pytest
import torch

import compiler
from compiler.codegen import exprs, indexing, matmul, reduction, rules, views
from compiler.lowering import ops
from tests.compiler.oputil import check, rand, trace


def test_op_sets_are_the_registry_by_kind() -> None:
    assert ops.POINTWISE == frozenset(exprs.POINTWISE)
    assert ops.VIEWS == frozenset(views.VIEWS)
    assert ops.INDEXING == frozenset(indexing.INDEX_OPS)
    assert ops.REDUCTIONS == frozenset(reduction.OPS) | frozenset(rules.COMPOSITE_REDUCTIONS)
    assert ops.MATMULS == frozenset(matmul.OPS)
    assert ops.NEVER_LOWER == frozenset(rules.ATEN_ONLY)
    sets = [ops.POINTWISE, ops.VIEWS, ops.INDEXING, ops.REDUCTIONS, ops.MATMULS, ops.NEVER_LOWER]
    assert sum(len(s) for s in sets) == len(rules.RULES), "an op is in two kinds"


def test_a_form_a_rule_leaves_to_aten_is_an_aten_call() -> None:
    x = rand((4, 6), seed=1)
    built = check(lambda x: torch.round(x, decimals=2) + 1, x, lowered=False)
    assert built.fallback_ops == ["aten.round.decimals"]
    assert [k.kind for k in built.kernels] == ["pointwise"]


def test_a_broken_rule_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(w: object, node: object, idx: object, mask: object) -> str:
        raise KeyError("a bug in a rule")

    monkeypatch.setitem(rules.RULES, "exp", rules.OpRule("pointwise", broken))
    x = rand((3, 7, 11), seed=2)  # a shape no other test builds: lowering caches by graph
    with pytest.raises(KeyError, match="a bug in a rule"):
        compiler.build(trace(lambda x: torch.exp(x) * 2, x), None, [x])
