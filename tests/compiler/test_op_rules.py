"""The op registry: one entry per op, the op sets read from it, and a rule's bug is an error
(never a silent ATen call)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import compiler
from compiler.codegen import exprs, indexing, matmul, reduction, rules, views
from compiler.codegen.common import TL_DTYPES, Unsupported
from compiler.codegen.writer import Writer
from compiler.ir import TensorMeta, meta
from compiler.lowering import ops
from compiler.lowering.lower import lower_fx
from tests.compiler.oputil import check, rand, trace

aten = torch.ops.aten


def test_op_sets_are_the_registry_by_kind() -> None:
    assert ops.POINTWISE == frozenset(exprs.POINTWISE)
    assert ops.VIEWS == frozenset(views.VIEWS)
    assert ops.INDEXING == frozenset(indexing.INDEX_OPS) | frozenset(rules.POOLING)
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


def _emitter_refuses(node: torch.fx.Node) -> bool:
    """Whether the op's emitter raises Unsupported for `node`'s value, every input read
    from a buffer: what each rule's declared `refuse` must say without emitting."""
    w = Writer(members=set(), is_buffer=lambda n: n is not node, int64=False, evaluate=rules.evaluate)
    try:
        w.value(node, tuple(f"i{d}" for d in range(len(meta(node).shape))), "mask")
    except Unsupported:
        return True
    return False


def _odd_forms() -> list[torch.fx.GraphModule]:
    x, i = rand((4, 6), seed=3), torch.tensor([2, 0, 1])
    forms = [
        lambda x: torch.round(x, decimals=2) + 1,
        lambda x: x.to(torch.int32) ** 9 + x.to(torch.int32) ** 2 + 2 ** x,
        lambda x: torch.sign(x.to(torch.uint8)) + torch.sign(x.to(torch.int8)),
        lambda x: torch.bitwise_and(x.to(torch.int32), 3),
        lambda x: torch.ops.aten.gelu_backward(x, x, approximate="tanh") + torch.ops.aten.gelu_backward(x, x),
        lambda x: (x[:, i] * 2, x[i] * 2),
    ]
    x4 = rand((1, 2, 12, 12), seed=4)
    # a pooling window kiln unrolls, and one it leaves to ATen
    return [trace(f, x) for f in forms] + [trace(_pool_and_back(k), x4) for k in ([3, 3], [9, 9])]


def _pool_and_back(kernel: list[int]) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = aten.max_pool2d_with_indices(x, kernel, [1, 1])
        mean = aten.avg_pool2d(x, kernel, [1, 1])
        adaptive = aten._adaptive_avg_pool2d(x, [12 // kernel[0]] * 2)  # 3x3 or 12x12 windows
        return values, indices, mean, aten.avg_pool2d_backward(mean, x, kernel, [1, 1], [0, 0], False, True, None), \
            aten.max_pool2d_with_indices_backward(values, x, kernel, [1, 1], [0, 0], [1, 1], False, indices), \
            adaptive, aten._adaptive_avg_pool2d_backward(adaptive, x)
    return fn


def test_each_rule_declares_the_forms_its_emitter_refuses() -> None:
    from tests.compiler.fusion_plans import graphs

    gms = [lower_fx(gm, list(inputs)).gm for _, gm, inputs in graphs()]
    gms += [lower_fx(gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]).gm
            for gm in _odd_forms()]
    seen = {True: 0, False: 0}
    for gm in gms:
        for node in gm.graph.nodes:
            rule = rules.rule_of(node) if node.op == "call_function" else None
            if rule is None or rule.kind not in ("pointwise", "index") or not all(
                    isinstance(n.meta.get("kiln_meta"), TensorMeta) and meta(n).dtype in TL_DTYPES
                    for n in (node, *node.all_input_nodes)):
                continue
            refused = rule.refuse(node) is not None
            assert refused == _emitter_refuses(node), (node.format_node(), rule.refuse(node))
            assert rules.node_kind(node).extern == refused
            seen[refused] += 1
    assert seen[True] >= 4 and seen[False] > 500, seen
