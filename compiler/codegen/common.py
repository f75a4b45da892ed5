"""What every part of code generation shares: dtypes, literals and casts, kernel variables,
the errors, and the index algebra (an index is a tuple of per-dimension Triton expressions
such as `x0`, `(x1 * 4 + r0)`, `0`; views and broadcasts transform it)."""

from __future__ import annotations

import functools
import math

import torch

from compiler.ir import TensorMeta, contiguous_strides

Index = tuple[str, ...]

TL_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}


class Var:
    """A kernel variable and its dtype."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def __repr__(self) -> str:
        return self.name


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


_GATHERED = "gathered_"


def gathered(name: str) -> str:
    """The position an index op loads from tensor `name` (a gather's index), as the op
    rules declare their reads: a symbol that no kernel's own index equals."""
    return f"{_GATHERED}{name}"


def is_gathered(expr: str) -> bool:
    """Whether an index expression depends on a position loaded from a tensor."""
    return _GATHERED in expr


def dim_names(flat: str, shape: tuple[int, ...], prefix: str) -> Index:
    """The per-dim index of a flat index over `shape` as a kernel names it: `0` for a
    size-1 dim, `flat` itself for the one dim it is, `<prefix><d>` for the others."""
    return tuple(e if e in ("0", flat) else f"{prefix}{d}" for d, e in enumerate(decompose(flat, shape)))


def norm_dim(dim: int, rank: int) -> int:
    """A dim argument (possibly negative) as an index into a shape of `rank` dims."""
    return dim + rank if dim < 0 else dim


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


def linear_expr(pos: str, step: object, start: object) -> str:
    """`start + pos * step`, without the zero and unit terms."""
    term = pos if step == 1 else f"{paren(pos)} * {step}"
    return term if start == 0 else f"{start} + {term}"


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


@functools.lru_cache(maxsize=1 << 16)  # a model's layers merge the same index again and again
def merge_dims(idx: Index, m: TensorMeta) -> tuple[Index, TensorMeta]:
    """Fold runs of dims whose index is the row-major split of one expression, and whose
    strides nest, into that one expression: (x // 64, x % 64) over strides (64, 1) -> x.

    Runs are looked for in the dims' order and, when that folds fewer, in memory order
    (strides descending; an offset is a sum, so its terms' order is free): attention's
    heads and head dim, read through a [B, H, S, D] view of [B, S, H, D] memory, are apart
    in the view and adjacent in memory. Unfolded, `(x // 64) * 64 + x % 64` hid from
    Triton that the load is contiguous, and a cat of three such views ran at half the
    speed of a copy on an H200."""
    merged = _merge_runs(idx, m)
    keep = [d for d in range(len(idx)) if not (m.shape[d] == 1 and idx[d] == "0")]
    order = sorted(keep, key=lambda d: -m.stride[d])
    if order == list(range(len(idx))):
        return merged
    in_memory = _merge_runs(tuple(idx[d] for d in order), TensorMeta(
        m.dtype, tuple(m.shape[d] for d in order), tuple(m.stride[d] for d in order), m.offset))
    return in_memory if len(in_memory[0]) < len(merged[0]) else merged


def _merge_runs(idx: Index, m: TensorMeta) -> tuple[Index, TensorMeta]:
    """merge_dims over runs of adjacent dims."""
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

