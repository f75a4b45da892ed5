"""The Writer: emits one kernel's body by asking for the value of an fx node at an index.

Buffers become masked loads; views transform the index (`views.py`); every other node is
computed by its op rule (the registry in `rules.py`, handed to the Writer as `evaluate`, so
that op rules can build on the Writer without an import circle). Anchors (reductions, the
matmul accumulator) are variables valid only at their own index: asking for one at any
other index raises `NotFusible`. The templates (`pointwise.py`, `reduction.py`,
`matmul.py`) emit the loops around the values and finish the module with `assemble`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from torch import fx

from compiler.codegen.common import (
    Index,
    NotFusible,
    Var,
    broadcast_index,
    compute_dtype,
    decompose,
    dim_names,
    linear,
    merge_dims,
    paren,
    tl_dtype,
)
from compiler.codegen.views import is_view, view_source
from compiler.ir import TensorMeta, contiguous_strides, dense, meta, same_strides

# Nested value() evaluations one Writer runs before unwinding (see Writer.value): each
# costs about five Python frames, so this stays well inside the default recursion limit.
MAX_VALUE_DEPTH = 48


class _TooDeep(BaseException):
    """Unwinds a too-deep value() request to the outermost call. A BaseException, so that
    no `except Exception` on the way (op rules, fusion trials) can swallow it."""

    def __init__(self, key: tuple) -> None:
        super().__init__()
        self.key = key


Evaluate = Callable[["Writer", fx.Node, Index, str], str]


class Writer:
    """Emits the body of one kernel: loads, math and stores, with per-scope caching."""

    def __init__(self, *, members: set[fx.Node], is_buffer: Callable[[fx.Node], bool],
                 int64: bool, evaluate: Evaluate) -> None:
        self.members = members
        self.evaluate = evaluate  # the op registry's: computes a non-view node at an index
        self.is_buffer = is_buffer
        self.int64 = int64
        self.lines: list[str] = []
        self.indent = 1
        self.scopes: list[dict] = [{}]
        self.anchors: dict[fx.Node, tuple[Index, str]] = {}
        self.in_params: dict[fx.Node, str] = {}
        self.out_params: dict[fx.Node, str] = {}
        self.flat_forms: dict[tuple[Index, tuple[int, ...]], str] = {}
        # flat forms that hold for buffers of these strides, not row-major ones
        self.flat_layouts: dict[tuple[Index, tuple[int, ...]], tuple[int, ...]] = {}
        self.combos: dict[str, str] = {}  # "r0 * 1024 + r1" -> "rindex" (see define_dims)
        # A block's mask -> the mask of its rows alone ("rowmask" -> "xmask", set by the
        # reduction kernels): a load whose offset reads row variables alone (a LayerNorm
        # backward's mean and rstd) takes the row mask and loads one value a row, where the
        # block's mask made every lane load it again (scalar 16-bit loads in the PTX).
        self.row_masks: dict[str, str] = {}
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
        if flat is not None:
            layout = self.flat_layouts.get((idx, m.shape))
            if dense(m) if layout is None else same_strides(m, layout):
                return flat
        idx, m = merge_dims(idx, m)
        if block:  # size-1 and broadcast dims keep a term (x * 0 folds away in compilation)
            return " + ".join(e if st == 1 else f"{paren(e)} * {st}"
                              for e, st in zip(idx, m.stride, strict=False) if e != "0") or "0"
        return linear([(e, st) for e, st, s in zip(idx, m.stride, m.shape, strict=False) if s != 1])

    def address(self, node: fx.Node, idx: Index, *, block: bool = False) -> tuple[fx.Node, str]:
        """(buffer node, offset) of the element at `idx`, following views to a buffer."""
        while not self.is_buffer(node):
            if not is_view(node):
                raise NotFusible(f"{node.name} is not a view of a buffer")
            node, idx = view_source(node, idx)
            self.note_inlined(node)
        return node, self.offset(meta(node), idx, block=block)

    def load(self, node: fx.Node, idx: Index, mask: str, *, upcast: bool = True) -> str:
        param = self.in_param(node)
        m = meta(node)
        offset = self.offset(m, idx)
        if offset.isdigit():  # one fixed, always valid element: a scalar load, no mask
            expr = f"tl.load({param} + {offset})" if offset != "0" else f"tl.load({param})"
        else:
            if mask in self.row_masks and _row_variables_only(offset):
                mask = self.row_masks[mask]
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
                var = self.evaluate(self, node, idx, mask)
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


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_ROW_VARIABLE = re.compile(r"xindex|x\d+")


def _row_variables_only(offset: str) -> bool:
    """Whether `offset` reads the row index variables alone (`xindex`, `x0`, ...)."""
    return all(_ROW_VARIABLE.fullmatch(name) for name in _IDENTIFIER.findall(offset))


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
    result = dim_names(flat, shape, prefix)
    for expr, var in zip(decompose(flat, shape), result, strict=True):
        if var != expr:
            w.emit(f"{var} = {expr}")
    # a view that merges these dims back computes exactly this sum: let it read `flat`
    if sum(e != "0" for e in result) > 1:
        w.combos[linear(list(zip(result, contiguous_strides(shape), strict=True)))] = flat
    return result
