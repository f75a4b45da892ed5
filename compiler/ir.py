"""kiln's loop-level IR: what lowering decides, before any Triton text exists.

A lowered graph is a `Program`: the aten FX graph (after decomposition, dead-code
elimination and constant folding) plus an ordered list of steps. Each step is a Triton
kernel over one iteration domain (`KernelGroup`), an ATen call (`ExternStep`) or a
zero-copy view of a buffer (`ViewStep`). Views, broadcasts, slices, gathers, `cat` and
padding inside kernels are index arithmetic in code generation, never copies.

`check_program` is the spec check at the pipeline's boundaries.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import fx

# Kernel groups' kinds: the domain a group iterates over. The kernel kinds that compute
# each (Triton templates, ATen calls) and their variants: compiler.codegen.kinds.
KINDS = ("pointwise", "reduction", "matmul")
# node.meta key naming a split reduction's stage ("stage1" or "stage2"), set by
# lowering/split_reductions.py and read by the reduction kind's fusion rules.
SPLIT_STAGE = "kiln_split"


class MetaError(ValueError):
    """Lowering's metadata run failed at `node`: the meta device cannot run it on its
    arguments' shapes or layouts."""

    def __init__(self, node: fx.Node, message: str) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class TensorMeta:
    """Dtype and layout of one tensor value."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @staticmethod
    def of(value: object) -> TensorMeta:
        """Meta of a tensor or of an input description with dtype/shape/stride/storage_offset."""
        if isinstance(value, torch.Tensor):
            return TensorMeta(value.dtype, tuple(value.shape), tuple(value.stride()),
                              value.storage_offset())
        shape = tuple(int(s) for s in value.shape)  # type: ignore[attr-defined]
        stride = getattr(value, "stride", None)
        stride = tuple(int(s) for s in (stride() if callable(stride) else stride or contiguous_strides(shape)))
        offset = getattr(value, "storage_offset", 0)
        offset = int(offset() if callable(offset) else offset or 0)
        return TensorMeta(value.dtype, shape, stride, offset)  # type: ignore[attr-defined]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `shape`."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def dense_strides(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a dense tensor of `shape` laid out in `order` (outermost dim first)."""
    strides, acc = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = acc
        acc *= max(shape[d], 1)  # as contiguous_strides and torch: empty dims count as 1
    return tuple(strides)


def same_strides(m: TensorMeta, want: tuple[int, ...]) -> bool:
    """`m` has strides `want`, ignoring the strides of size-1 dims."""
    return strides_match(m.shape, m.stride, want)


def strides_match(shape: Sequence[int], have: Sequence[int], want: Sequence[int]) -> bool:
    """Strides `have` and `want` agree on every dim of `shape` but those of size 1."""
    return all(s == 1 or a == b for s, a, b in zip(shape, have, want, strict=False))


def dense(m: TensorMeta) -> bool:
    """Row-major contiguous, ignoring the strides of size-1 dims."""
    return same_strides(m, contiguous_strides(m.shape))


def memory_order(m: TensorMeta) -> tuple[int, ...]:
    """Dims outermost first by stride (size-1 and broadcast dims first, in dim order)."""
    def key(d: int) -> tuple[int, int, int]:
        if m.shape[d] == 1 or m.stride[d] == 0:
            return (0, 0, d)
        return (1, -m.stride[d], d)
    return tuple(sorted(range(len(m.shape)), key=key))


def storage_order(m: TensorMeta) -> tuple[int, ...]:
    """`memory_order(m)` when `m` is dense in that order and it is not row-major
    (channels-last, a transposed copy); () otherwise."""
    if dense(m):
        return ()
    order = memory_order(m)
    return order if same_strides(m, dense_strides(m.shape, order)) else ()


@dataclass(frozen=True)
class Domain:
    """Iteration domain of a kernel.

    pointwise: `shape` is the output shape, `rdims` empty.
    reduction: `shape` is the reduction input's shape, `rdims` the reduced dims (sorted).
    matmul: `shape` is the output's shape ([batch,] M, N), `rdims` empty, `k` the inner size.
    `order` (pointwise only): the dims from outermost to innermost that the flat index
    walks, when not row-major: that of its first value's memory (`storage_order`).
    """

    shape: tuple[int, ...]
    rdims: tuple[int, ...] = ()
    k: int = 0
    order: tuple[int, ...] = ()

    @property
    def kept(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in self.rdims)

    @property
    def xnumel(self) -> int:
        return math.prod(self.shape[d] for d in self.kept)

    @property
    def rnumel(self) -> int:
        return math.prod(self.shape[d] for d in self.rdims)

    @property
    def inner(self) -> bool:
        """The reduced dims are the trailing ones: each program reduces whole rows."""
        n = len(self.shape)
        return self.rdims == tuple(range(n - len(self.rdims), n))


@dataclass
class KernelGroup:
    """One Triton kernel: realized nodes computed over one domain.

    `members` are the realized fx nodes in topological order (`anchors`: its reductions or
    its matmul; other members are pointwise values over the domain or the reduced
    domain); `inlined` are the lazy nodes (pointwise, views, index ops) evaluated inside;
    `stored` are the members written to buffers. `name` is unique in its program (the
    schedule's key for the kernel); `stem` is the part of it that comes from the fused ops,
    and starts the Triton function's name, which is otherwise made from the source itself.
    `fused_bytes` is the memory traffic its fusion saves (Inductor's score_fusion_memory):
    every member that another member reads would, in kernels of their own, be written
    (unless it is stored anyway) and read back.
    """

    name: str
    kind: str
    domain: Domain
    members: list[fx.Node]
    position: int
    anchors: list[fx.Node] = field(default_factory=list)
    inlined: list[fx.Node] = field(default_factory=list)
    stored: list[fx.Node] = field(default_factory=list)
    reads: list[fx.Node] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
    stem: str = "kernel"
    fused_bytes: int = 0

    @property
    def sizes(self) -> dict[str, int]:
        d = self.domain
        if self.kind == "pointwise":
            return {"xnumel": d.xnumel}
        if self.kind == "reduction":
            return {"xnumel": d.xnumel, "rnumel": d.rnumel}
        batch = d.shape[0] if len(d.shape) == 3 else 1
        return {"M": d.shape[-2], "N": d.shape[-1], "K": d.k, "batch": batch}


@dataclass(frozen=True)
class ExternStep:
    """An ATen call (op not lowered to Triton), or a `getitem` of one's tuple result."""

    node: fx.Node


@dataclass(frozen=True)
class ViewStep:
    """A zero-copy view of a buffer that an ATen call or the graph's outputs need."""

    node: fx.Node


Step = KernelGroup | ExternStep | ViewStep


@dataclass
class Program:
    """A lowered graph: fx graph with metas, the ordered steps, and the node origins."""

    gm: fx.GraphModule
    steps: list[Step]
    placeholders: list[fx.Node]
    origins: dict[str, str]  # node name -> name of the input graph's node it came from
    original_ops: dict[str, str]  # input graph's node name -> op name
    buffers: set[fx.Node] = field(default_factory=set)  # nodes whose values live in memory

    def is_buffer(self, node: fx.Node) -> bool:
        return node in self.buffers

    @property
    def kernels(self) -> list[KernelGroup]:
        return [s for s in self.steps if isinstance(s, KernelGroup)]

    def origin_names(self, nodes: list[fx.Node]) -> list[str]:
        """Input-graph node names behind `nodes`, unique, in input-graph order."""
        order = self._origin_order
        names = {self.origins.get(n.name, n.name) for n in nodes}
        return sorted((n for n in names if n in order), key=order.__getitem__)

    @functools.cached_property
    def _origin_order(self) -> dict[str, int]:
        # asked for every kernel (names, schedules, comments): made once per program
        return {name: i for i, name in enumerate(self.original_ops)}


def meta(node: fx.Node) -> TensorMeta:
    """TensorMeta of an fx node's value (set by lowering's metadata propagation)."""
    value = node.meta.get("kiln_meta")
    if value is None:
        raise ValueError(f"node {node.name} ({node.target}) has no tensor metadata")
    return value


def op_name(node: fx.Node) -> str:
    """`aten.add.Tensor` style name of a call_function node's target."""
    target = node.target
    if target is operator.getitem:
        return "operator.getitem"
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def base_name(node: fx.Node) -> str:
    """The op's name without namespace and overload: `add` for `aten.add.Tensor`."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target))


def check_program(program: Program) -> None:
    """The IR spec: raises ValueError when a lowered program breaks an invariant."""
    seen: set[str] = {p.name for p in program.placeholders}
    seen |= {n.name for n in program.gm.graph.nodes if n.op == "get_attr"}
    names = set()
    for step in program.steps:
        if isinstance(step, KernelGroup):
            if step.kind not in KINDS:
                raise ValueError(f"kernel {step.name}: unknown kind {step.kind!r}")
            if step.name in names:
                raise ValueError(f"kernel name {step.name} used twice")
            names.add(step.name)
            if not step.members:
                raise ValueError(f"kernel {step.name} computes nothing")
            for read in step.reads:
                if read.name not in seen:
                    raise ValueError(f"kernel {step.name} reads {read.name} before it exists")
            seen.update(m.name for m in step.stored)
        else:
            seen.add(step.node.name)
