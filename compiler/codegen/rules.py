"""The op registry: every aten op kiln lowers, by base name (`add` for `aten.add.Tensor`),
with its kind and the rule that generates it. Adding an op is one entry in its kind's table;
the op sets (`compiler/lowering/ops.py`) and fusion's classification are read from here.

| kind | what the op becomes | its rules |
| --- | --- | --- |
| pointwise | an expression of its inputs at the same index (or of the index alone) | `exprs.POINTWISE` |
| view | index arithmetic over its input, never a copy | `views.VIEWS` |
| index | loads of its inputs at computed positions | `indexing.INDEX_OPS` |
| reduction | the anchor of a reduction kernel | `reduction.OPS` |
| matmul | the anchor of a matmul kernel | `matmul.OPS` |
| aten | always an ATen call: random or data-dependent in shape | `ATEN_ONLY` below |

An op that is not in the registry is an ATen call too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import fx

from compiler.codegen import exprs, indexing, matmul, reduction, views
from compiler.codegen.common import Index, Unsupported, tl_dtype
from compiler.codegen.writer import Writer
from compiler.ir import base_name, meta

# Composite reductions lowering decomposes into the reductions of `reduction.OPS`.
COMPOSITE_REDUCTIONS = ("var", "std", "var_mean", "logsumexp")

ATEN_ONLY = (
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "bernoulli",
    "native_dropout", "uniform", "normal", "randperm", "nonzero", "unique", "sort", "topk",
    "multinomial", "item", "_local_scalar_dense",
)


@dataclass(frozen=True)
class OpRule:
    """How one aten op is generated: `kind` (see the table above) and, for the kinds
    computed at an index (pointwise, index), `emit(writer, node, index, mask)`, which
    returns the Triton expression of the node's value there."""

    kind: str
    emit: Callable[[Writer, fx.Node, Index, str], str] | None = None


RULES: dict[str, OpRule] = {
    **{name: OpRule("pointwise", emit) for name, emit in exprs.POINTWISE.items()},
    **dict.fromkeys(views.VIEWS, OpRule("view")),
    **{name: OpRule("index", emit) for name, emit in indexing.INDEX_OPS.items()},
    **dict.fromkeys((*reduction.OPS, *COMPOSITE_REDUCTIONS), OpRule("reduction")),
    **dict.fromkeys(matmul.OPS, OpRule("matmul")),
    **dict.fromkeys(ATEN_ONLY, OpRule("aten")),
}


def ops_of(kind: str) -> frozenset[str]:
    """The base names of every op of `kind`."""
    return frozenset(name for name, rule in RULES.items() if rule.kind == kind)


def evaluate(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    """Emit the computation of `node` at `idx`; returns the variable holding it."""
    if node.op != "call_function":
        raise Unsupported(f"{node.name} is not computed in kernels")
    out = meta(node)
    if out.dtype.is_complex:
        raise Unsupported("complex values")
    tl_dtype(out.dtype)
    if views.is_view(node):
        src, sidx = views.view_source(node, idx)
        return w.value(src, sidx, mask)
    name = base_name(node)
    rule = RULES.get(name)
    if rule is None or rule.emit is None:
        raise Unsupported(f"no Triton lowering for {name}")
    return w.tmp(rule.emit(w, node, idx, mask))
