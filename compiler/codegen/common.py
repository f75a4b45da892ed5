"""What every kernel template shares: the value evaluator, dtypes, literals, index algebra.

A kernel is written by asking the `Writer` for the value of an fx node at an index: a
tuple of per-dimension index expressions (strings such as `x0`, `(x1 * 4 + r0)`, `0`).
Buffers become masked loads; views, broadcasts and index ops transform the index;
pointwise ops combine their inputs' values; anchors (reductions, the matmul accumulator)
are variables valid only at their own index. Asking for an anchor at any other index
raises `NotFusible`, which is how fusion learns that a group cannot be one kernel.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import torch
from torch import fx

from compiler.ir import TensorMeta, contiguous_strides, meta

Index = tuple[str, ...]

TL_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}


class NotFusible(Exception):
    """The requested group cannot be generated as one kernel."""


class Unsupported(Exception):
    """An op or argument combination that code generation does not handle."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision values are computed in fp32 (rounded where the graph casts)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def tl_dtype(dtype: torch.dtype) -> str:
    try:
        return TL_DTYPES[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype} has no Triton equivalent here") from None


def literal(value: object, dtype: torch.dtype) -> str:
    """A Python scalar as Triton source of `dtype`'s kind (inf and nan spelled out)."""
    if dtype == torch.bool:
        return "1" if bool(value) else "0"
    if dtype.is_floating_point:
        v = float(value)  # type: ignore[arg-type]
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        text = repr(v)
        return f"({text})" if v < 0 else text
    v = int(value)  # type: ignore[arg-type]
    info = torch.iinfo(dtype)
    if not info.min <= v <= info.max:
        # Eager refuses such a fill too; as an ATen call the graph gets eager's error.
        raise Unsupported(f"an integer constant does not fit {dtype}")
    return f"({v})" if v < 0 else str(v)


def cast(op: object, dtype: torch.dtype) -> str:
    """Operand as Triton source of compute dtype `dtype`."""
    if isinstance(op, Var):
        if op.dtype == dtype:
            return op.name
        if dtype == torch.bool:
            return f"({op.name} != 0)"
        return f"{op.name}.to({tl_dtype(dtype)})"
    if isinstance(op, (bool, int, float)):
        return literal(op, dtype)
    raise Unsupported(f"operand {op!r} is neither a tensor nor a number")


def paren(expr: str) -> str:
    """`expr` safe to use as an operand."""
    if expr.isidentifier() or expr.lstrip("-").isdigit() and not expr.startswith("-"):
        return expr
    if expr.startswith("(") and _balanced_outer(expr):
        return expr
    return f"({expr})"


def _balanced_outer(expr: str) -> bool:
    depth = 0
    for i, ch in enumerate(expr):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(expr) - 1:
            return False
    return True


def linear(terms: list[tuple[str, int]], offset: int = 0) -> str:
    """sum(index * stride) + offset, dropping zero terms."""
    parts = []
    for expr, stride in terms:
        if expr == "0" or stride == 0:
            continue
        parts.append(paren(expr) if stride == 1 else f"{paren(expr)} * {stride}")
    if offset:
        parts.append(str(offset))
    return " + ".join(parts) if parts else "0"


def decompose(flat: str, shape: tuple[int, ...]) -> Index:
    """Per-dim index expressions of a row-major flat index over `shape`."""
    out, inner = [], 1
    strides = contiguous_strides(shape)
    first = next((i for i, s in enumerate(shape) if s != 1), len(shape))
    for d, size in enumerate(shape):
        if size == 1:
            out.append("0")
            continue
        expr = flat if strides[d] == 1 else f"{paren(flat)} // {strides[d]}"
        if d != first:
            expr = f"{paren(expr)} % {size}"
        out.append(expr)
        inner *= size
    return tuple(out)


def undecompose(exprs: tuple[str, ...], shape: tuple[int, ...]) -> str | None:
    """The flat index X when `exprs` is exactly `decompose(X, shape)`, else None."""
    strides = contiguous_strides(shape)
    for e, size, st in zip(exprs, shape, strides, strict=True):
        if size == 1:
            continue
        if st == 1:
            cand = e
        else:
            suffix = f" // {st}"
            if not e.endswith(suffix):
                return None
            cand = e[: -len(suffix)]
            if cand.startswith("(") and _balanced_outer(cand):
                cand = cand[1:-1]
        return cand if decompose(cand, shape) == tuple(exprs) else None
    return None


def reshape_index(idx: Index, out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> Index:
    """Index into `in_shape` of the element at `idx` of its reshape to `out_shape`."""
    result = ["0"] * len(in_shape)
    ins = [d for d, s in enumerate(in_shape) if s != 1]
    outs = [d for d, s in enumerate(out_shape) if s != 1]
    a = b = 0
    while a < len(ins) and b < len(outs):
        ga, gb = [ins[a]], [outs[b]]
        pa, pb = in_shape[ins[a]], out_shape[outs[b]]
        while pa != pb:
            if pa < pb:
                a += 1
                ga.append(ins[a])
                pa *= in_shape[ins[a]]
            else:
                b += 1
                gb.append(outs[b])
                pb *= out_shape[outs[b]]
        a, b = a + 1, b + 1
        if len(ga) == 1 and len(gb) == 1:
            result[ga[0]] = idx[gb[0]]
            continue
        sub_out = tuple(out_shape[d] for d in gb)
        flat = undecompose(tuple(idx[d] for d in gb), sub_out) or linear(
            [(idx[d], s) for d, s in zip(gb, contiguous_strides(sub_out), strict=False)])
        sub_in = tuple(in_shape[d] for d in ga)
        for d, expr in zip(ga, decompose(flat, sub_in), strict=False):
            result[d] = expr
    return tuple(result)


def broadcast_index(idx: Index, out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> Index:
    """Index into an input broadcast (right-aligned) to `out_shape`."""
    lead = len(out_shape) - len(in_shape)
    if lead < 0:
        raise Unsupported(f"cannot broadcast {in_shape} to {out_shape}")
    return tuple("0" if in_shape[d] == 1 else idx[lead + d] for d in range(len(in_shape)))


def merge_dims(idx: Index, m: TensorMeta) -> tuple[Index, TensorMeta]:
    """Fold runs of dims whose index is the row-major split of one expression, and whose
    strides nest, into that one expression: (x // 64, x % 64) over strides (64, 1) -> x."""
    n = len(idx)
    out_idx, shape, stride = [], [], []
    i = 0
    while i < n:
        for j in range(n, i + 1, -1):
            run = range(i, j)
            nested = all(m.stride[k] == m.stride[k + 1] * m.shape[k + 1] for k in run[:-1])
            flat = nested and undecompose(tuple(idx[k] for k in run), tuple(m.shape[k] for k in run))
            if flat:
                out_idx.append(flat)
                shape.append(math.prod(m.shape[i:j]))
                stride.append(m.stride[j - 1])
                i = j
                break
        else:
            out_idx.append(idx[i])
            shape.append(m.shape[i])
            stride.append(m.stride[i])
            i += 1
    return tuple(out_idx), TensorMeta(m.dtype, tuple(shape), tuple(stride), m.offset)


def dense(m: TensorMeta) -> bool:
    """Row-major contiguous, ignoring the strides of size-1 dims."""
    want = contiguous_strides(m.shape)
    return all(s == 1 or a == b for s, a, b in zip(m.shape, m.stride, want, strict=False))


# Nested value() evaluations one Writer runs before unwinding (see Writer.value): each
# costs about five Python frames, so this stays well inside the default recursion limit.
MAX_VALUE_DEPTH = 48


class _TooDeep(BaseException):
    """Unwinds a too-deep value() request to the outermost call. A BaseException, so that
    no `except Exception` on the way (op rules, fusion trials) can swallow it."""

    def __init__(self, key: tuple) -> None:
        super().__init__()
        self.key = key


class Writer:
    """Emits the body of one kernel: loads, math and stores, with per-scope caching."""

    def __init__(self, *, members: set[fx.Node], is_buffer: Callable[[fx.Node], bool],
                 int64: bool) -> None:
        self.members = members
        self.is_buffer = is_buffer
        self.int64 = int64
        self.lines: list[str] = []
        self.indent = 1
        self.scopes: list[dict] = [{}]
        self.anchors: dict[fx.Node, tuple[Index, str]] = {}
        self.in_params: dict[fx.Node, str] = {}
        self.out_params: dict[fx.Node, str] = {}
        self.flat_forms: dict[tuple[Index, tuple[int, ...]], str] = {}
        self.combos: dict[str, str] = {}  # "r0 * 1024 + r1" -> "rindex" (see define_dims)
        self.helpers: set[str] = set()
        self.inlined: dict[fx.Node, None] = {}  # ordered set: large kernels inline thousands
        self.counter = 0
        self.depth = 0  # nesting of value() calls in progress (see value)

    # ---- text ----
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def tmp(self, expr: str, prefix: str = "tmp") -> str:
        """A variable holding `expr`; an expression already computed in scope is reused."""
        if expr.isidentifier():
            return expr
        for scope in reversed(self.scopes):
            if ("expr", expr) in scope:
                return scope[("expr", expr)]
        name = f"{prefix}{self.counter}"
        self.counter += 1
        self.emit(f"{name} = {expr}")
        self.scopes[-1][("expr", expr)] = name
        return name

    def push(self) -> None:
        self.scopes.append({})
        self.indent += 1

    def pop(self) -> None:
        self.scopes.pop()
        self.indent -= 1

    # ---- buffers ----
    def in_param(self, node: fx.Node) -> str:
        if node not in self.in_params:
            self.in_params[node] = f"in_ptr{len(self.in_params)}"
        return self.in_params[node]

    def out_param(self, node: fx.Node) -> str:
        if node not in self.out_params:
            self.out_params[node] = f"out_ptr{len(self.out_params)}"
        return self.out_params[node]

    def offset(self, m: TensorMeta, idx: Index, *, block: bool = False) -> str:
        """Element offset of `idx` in a buffer of layout `m` (its storage offset is in the
        pointer). With `block`, every index term stays, so the offset keeps its block shape."""
        idx = tuple(self.combos.get(e, e) for e in idx)
        flat = self.flat_forms.get((idx, m.shape))
        if flat is not None and dense(m):
            return flat
        idx, m = merge_dims(idx, m)
        if block:  # size-1 and broadcast dims keep a term (x * 0 folds away in compilation)
            return " + ".join(e if st == 1 else f"{paren(e)} * {st}"
                              for e, st in zip(idx, m.stride, strict=False) if e != "0") or "0"
        return linear([(e, st) for e, st, s in zip(idx, m.stride, m.shape, strict=False) if s != 1])

    def address(self, node: fx.Node, idx: Index, *, block: bool = False) -> tuple[fx.Node, str]:
        """(buffer node, offset) of the element at `idx`, following views to a buffer."""
        from compiler.codegen import exprs

        while not self.is_buffer(node):
            if not exprs.is_view(node):
                raise NotFusible(f"{node.name} is not a view of a buffer")
            node, idx = exprs.view_source(node, idx)
            self.note_inlined(node)
        return node, self.offset(meta(node), idx, block=block)

    def load(self, node: fx.Node, idx: Index, mask: str, *, upcast: bool = True) -> str:
        param = self.in_param(node)
        m = meta(node)
        offset = self.offset(m, idx)
        if offset.isdigit():  # one fixed, always valid element: a scalar load, no mask
            expr = f"tl.load({param} + {offset})" if offset != "0" else f"tl.load({param})"
        else:
            expr = f"tl.load({param} + {paren(offset)}, {mask}, other=0)"
        want = compute_dtype(m.dtype) if upcast else m.dtype
        if want != m.dtype:
            expr = f"{expr}.to({tl_dtype(want)})"
        return self.tmp(expr)

    def note_inlined(self, node: fx.Node) -> None:
        if node not in self.members and not self.is_buffer(node):
            self.inlined.setdefault(node)

    # ---- values ----
    def value(self, node: fx.Node, idx: Index, mask: str) -> str:
        """Variable holding `node`'s value (in its compute dtype) at `idx`.

        Evaluation recurses through a value's operands. So that a long chain never meets
        Python's recursion limit, a request deeper than `MAX_VALUE_DEPTH` unwinds to the
        outermost call, which computes that value first (cached) and then starts again: a
        loop, not a deeper stack. Graphs shallower than the bound emit exactly as before,
        and the order is fixed by the graph alone, so every machine emits the same source."""
        if self.depth:
            return self._value(node, idx, mask)
        pending = [(node, idx, mask)]
        while True:
            try:
                var = self._value(*pending[-1])
            except _TooDeep as deep:
                pending.append(deep.key)
                continue
            pending.pop()
            if not pending:
                return var

    def _value(self, node: fx.Node, idx: Index, mask: str) -> str:
        from compiler.codegen import exprs

        key = (node, idx, mask)
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        if node in self.anchors:
            natural, var = self.anchors[node]
            if idx != natural:
                raise NotFusible(f"{node.name} is needed at another index than it is computed")
            return var
        if self.is_buffer(node) and node not in self.members:
            var = self.load(node, idx, mask)
        else:
            if self.depth >= MAX_VALUE_DEPTH:
                raise _TooDeep(key)
            self.note_inlined(node)
            self.depth += 1
            try:
                var = exprs.evaluate(self, node, idx, mask)
            finally:
                self.depth -= 1
        self.scopes[-1][key] = var
        return var

    def operand(self, arg: object, node: fx.Node, idx: Index, mask: str) -> object:
        """Value of one argument of `node` (a tensor broadcast to node's shape, or a scalar)."""
        if isinstance(arg, fx.Node):
            m = meta(arg)
            return Var(self.value(arg, broadcast_index(idx, meta(node).shape, m.shape), mask),
                       compute_dtype(m.dtype))
        return arg


class Var:
    """A kernel variable and its dtype."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def __repr__(self) -> str:
        return self.name


def index_bits(metas: list[TensorMeta]) -> bool:
    """True when some offset or numel of these tensors needs 64-bit indexing."""
    limit = 2**31 - 1
    for m in metas:
        span = sum((s - 1) * abs(st) for s, st in zip(m.shape, m.stride, strict=False) if s > 0)
        if m.numel > limit or span > limit:
            return True
    return False


HEADER = "import triton\nimport triton.language as tl\n"


class Generated:
    """One generated kernel module: its source, the buffers it reads and writes, in order."""

    def __init__(self, name: str, source: str, inputs: list[fx.Node], outputs: list[fx.Node],
                 inlined: list[fx.Node]) -> None:
        self.name, self.source = name, source
        self.inputs, self.outputs, self.inlined = inputs, outputs, inlined


def assemble(w: Writer, stem: str, comment: list[str], constexprs: list[str]) -> Generated:
    """The kernel module: imports, helpers, then the kernel with pointers first and
    `tl.constexpr` block sizes last (the Triton tutorial's order).

    The function is named `<stem>_<8 hex digits>`, the digits hashed from the rest of the
    module: the source depends on what the kernel computes, never on its place in the
    graph, so a model's repeated layers produce identical kernels that compile once."""
    params = list(w.in_params.values()) + list(w.out_params.values())
    params += [f"{c}: tl.constexpr" for c in constexprs]
    head = [HEADER, *sorted(w.helpers), "", "@triton.jit"]
    body = [*(f"    # {line}" for line in comment), *w.lines]
    signature = f"({', '.join(params)}):"
    digest = hashlib.sha256("\n".join([stem, *head, signature, *body]).encode()).hexdigest()
    name = f"{stem}_{digest[:8]}"
    text = [*head, f"def {name}{signature}", *body]
    return Generated(name, "\n".join(text) + "\n", list(w.in_params), list(w.out_params),
                     list(w.inlined))


def store(w: Writer, node: fx.Node, idx: Index, var: str, mask: str, *, block: bool = False) -> None:
    """Write `var` (node's value at idx) to node's output buffer."""
    m = meta(node)
    value = var if compute_dtype(m.dtype) == m.dtype else f"{var}.to({tl_dtype(m.dtype)})"
    w.emit(f"tl.store({w.out_param(node)} + {paren(w.offset(m, idx, block=block))}, {value}, {mask})")


def define_dims(w: Writer, flat: str, shape: tuple[int, ...], prefix: str) -> Index:
    """Emit per-dim index variables of a flat index over `shape`; returns the index."""
    result = []
    for d, expr in enumerate(decompose(flat, shape)):
        if expr in ("0", flat):
            result.append(expr)
        else:
            var = f"{prefix}{d}"
            w.emit(f"{var} = {expr}")
            result.append(var)
    # a view that merges these dims back computes exactly this sum: let it read `flat`
    if sum(e != "0" for e in result) > 1:
        w.combos[linear(list(zip(result, contiguous_strides(shape), strict=True)))] = flat
    return tuple(result)
