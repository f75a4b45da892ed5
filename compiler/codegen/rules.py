"""The op registry: every aten op kiln lowers, by base name (`add` for `aten.add.Tensor`),
with its kind and the rule that generates it. Adding an op is one entry in its kind's table;
the op sets (`compiler/lowering/ops.py`) and fusion's classification are read from here.

| kind | what the op becomes | its rules |
| --- | --- | --- |
| pointwise | an expression of its inputs at the same index (or of the index alone) | `exprs.POINTWISE` |
| view | index arithmetic over its input, never a copy | `views.VIEWS` |
| index | loads of its inputs at computed positions | `indexing.INDEX_OPS`, `POOLING` below |
| reduction | the anchor of a reduction kernel | `reduction.OPS` |
| matmul | the anchor of a matmul kernel | `matmul.OPS` |
| aten | always an ATen call: random or data-dependent in shape | `ATEN_ONLY` below |

An op that is not in the registry is an ATen call too. An op with a tuple of results
(`max_pool2d_with_indices`) has a rule per result (`pieces`): its getitems are computed,
each by its piece's rule, and the tuple itself is a view (never computed or stored), as
a split's is; when its rule refuses it, the tuple and its getitems are ATen calls.

Besides emitting, each rule declares, as metadata that fusion plans with and no code:
- `refuse(node)`: why a node of the op cannot be computed in a kernel (a form left to ATen),
  or None; fusion classifies such a node as an ATen call;
- `reads(node, index)` (the kinds computed at an index): where its value at `index` reads
  each input, with the emitter's own index arithmetic (`compiler.codegen.access` turns it
  into the access patterns: same index, broadcast, gathered, ...).

Fusion sees a node through its `NodeKind`: the flags that say what planning does with it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from torch import fx

from compiler.codegen import exprs, indexing, matmul, pooling, reduction, views
from compiler.codegen.common import TL_DTYPES, Index, Unsupported, tl_dtype
from compiler.codegen.writer import Writer
from compiler.ir import TensorMeta, base_name, meta

# Composite reductions lowering decomposes into the reductions of `reduction.OPS`.
COMPOSITE_REDUCTIONS = ("var", "std", "var_mean", "logsumexp")

ATEN_ONLY = (
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "bernoulli",
    "native_dropout", "uniform", "normal", "randperm", "nonzero", "unique", "sort", "topk",
    "multinomial", "item", "_local_scalar_dense",
)


Reads = Callable[[fx.Node, Index], list[tuple[fx.Node, Index]]]


def _never(node: fx.Node) -> str | None:
    return None


def _view_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    return [views.view_source(node, idx)]


def _refusal_of(check: Callable[[fx.Node], object]) -> Callable[[fx.Node], str | None]:
    """A refusal from a metadata check that raises Unsupported for the forms left to ATen."""
    def refuse(node: fx.Node) -> str | None:
        try:
            check(node)
        except Unsupported as exc:
            return str(exc)
        return None
    return refuse


@dataclass(frozen=True)
class OpRule:
    """How one aten op is generated: `kind` (see the table above) and, for the kinds
    computed at an index (pointwise, index), `emit(writer, node, index, mask)`, which
    returns the Triton expression of the node's value there, and `reads`, where that
    value reads its inputs; `refuse` says why a node cannot be in a kernel (or None). An
    op with a tuple of results has the rule of each result's getitem in `pieces`."""

    kind: str
    emit: Callable[[Writer, fx.Node, Index, str], str] | None = None
    reads: Reads | None = None
    refuse: Callable[[fx.Node], str | None] = _never
    pieces: tuple[OpRule, ...] = ()


# Pooling: index ops with a window of loads per element (`pooling.py`).
POOLING: dict[str, OpRule] = {
    "max_pool2d_with_indices": OpRule(
        "index", refuse=pooling.forward_refusal,
        pieces=tuple(OpRule("index", *piece) for piece in pooling.MAX_PIECES)),
    **{name: OpRule("index", *rule) for name, rule in pooling.OPS.items()},
}


RULES: dict[str, OpRule] = {
    **{name: OpRule("pointwise", emit, exprs.reads, exprs.refusal) for name, emit in exprs.POINTWISE.items()},
    **dict.fromkeys(views.VIEWS, OpRule("view", reads=_view_reads)),
    **{name: OpRule("index", emit, indexing.INDEX_READS[name], indexing.index_refusal)
       for name, emit in indexing.INDEX_OPS.items()},
    **POOLING,
    **dict.fromkeys((*reduction.OPS, *COMPOSITE_REDUCTIONS),
                    OpRule("reduction", refuse=_refusal_of(reduction.reduction_info))),
    **dict.fromkeys(matmul.OPS, OpRule("matmul", refuse=_refusal_of(matmul.check))),
    **dict.fromkeys(ATEN_ONLY, OpRule("aten")),
}


def ops_of(kind: str) -> frozenset[str]:
    """The base names of every op of `kind`."""
    return frozenset(name for name, rule in RULES.items() if rule.kind == kind)


@dataclass(frozen=True)
class NodeKind:
    """What fusion does with a node of one kind (an op rule's kind, or a node no rule
    computes). `name` is the kind's name in plans; planning reads only the flags."""

    name: str
    source: bool = False  # a graph input or constant: in memory before the graph runs
    anchor: bool = False  # anchors a kernel of its own kind (`KernelKind.anchor_op`)
    extern: bool = False  # an ATen call: its own step, its result in a buffer
    view: bool = False  # index arithmetic over its input: never computed, never stored
    lazy: bool = False  # computed where it is read, or stored where kernels share it
    reads_memory: bool = False  # reads its inputs from buffers (an ATen call, a matmul)
    windows: bool = False  # may read an input at several computed positions (pooling)

    @property
    def realized(self) -> bool:
        """Always gets a buffer."""
        return self.anchor or self.extern


NODE_KINDS: dict[str, NodeKind] = {k.name: k for k in (
    NodeKind("input", source=True), NodeKind("const", source=True), NodeKind("output"),
    NodeKind("extern", extern=True, reads_memory=True), NodeKind("view", view=True),
    NodeKind("pointwise", lazy=True), NodeKind("index", lazy=True, windows=True),
    NodeKind("reduction", anchor=True), NodeKind("matmul", anchor=True, reads_memory=True),
)}


def _piece_source(node: fx.Node) -> fx.Node | None:
    """The op `node` is a getitem of, when that op's rule has pieces."""
    if node.target is not operator.getitem:
        return None
    src = node.args[0]
    if not (isinstance(src, fx.Node) and src.op == "call_function"):
        return None
    rule = RULES.get(base_name(src))
    return src if rule is not None and rule.pieces else None


def rule_of(node: fx.Node) -> OpRule | None:
    """The rule computing `node` (a getitem of an op with pieces: its piece's), or None."""
    src = _piece_source(node)
    if src is not None:
        return RULES[base_name(src)].pieces[node.args[1]]
    return RULES.get(base_name(node))


def node_kind(node: fx.Node) -> NodeKind:
    """The kind of `node`, from the registry's metadata alone (no code is generated): an
    ATen call when no rule computes it in a kernel, its dtype or an input's has no Triton
    equivalent, or its rule refuses its form."""
    if node.op in ("placeholder", "output", "get_attr"):
        return NODE_KINDS[{"placeholder": "input", "output": "output", "get_attr": "const"}[node.op]]
    name = base_name(node)
    if name in views.SPLITS:
        return NODE_KINDS["view"]  # its getitems are slices of its input
    src = _piece_source(node)
    if src is not None:  # computed by its piece's rule, unless the tuple is an ATen call
        return NODE_KINDS["extern" if node_kind(src).extern else rule_of(node).kind]  # type: ignore[union-attr]
    if node.target is operator.getitem:
        return NODE_KINDS["view" if views.is_view(node) else "extern"]
    rule = RULES.get(name)
    if rule is None or rule.kind == "aten" or not _triton_typed(node, tuple_of=bool(rule.pieces)) or \
            not all(_triton_typed(a) for a in node.all_input_nodes) or rule.refuse(node) is not None:
        return NODE_KINDS["extern"]
    return NODE_KINDS["view" if rule.pieces else rule.kind]  # a tuple: its getitems are computed


def _triton_typed(node: fx.Node, tuple_of: bool = False) -> bool:
    """Whether `node`'s value (`tuple_of`: each of its tuple of results) has a Triton dtype."""
    m = node.meta.get("kiln_meta")
    metas = m if tuple_of and isinstance(m, tuple) else (m,)
    return all(isinstance(t, TensorMeta) and t.dtype in TL_DTYPES for t in metas)


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
    rule = rule_of(node)
    if rule is None or rule.emit is None:
        raise Unsupported(f"no Triton lowering for {base_name(node)}")
    return w.tmp(rule.emit(w, node, idx, mask))
