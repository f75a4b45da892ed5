"""2-D pooling as loads at computed positions: each value a small static window.

Max pooling forward (`max_pool2d_with_indices`, a tuple of results): its values and its
indices are each computed at an output index by one unrolled loop over the kernel's
kh * kw window (its getitems' rules, `MAX_PIECES`; the tuple itself is never computed or
stored). Both walk the window in the same order with the same expressions, so a kernel
that stores both emits the loop once (the Writer reuses every expression in scope). As
ATen's CPU and CUDA kernels: positions outside the input are skipped, an element replaces
the running maximum when it is greater or NaN (so the first maximum wins ties and the last
NaN wins a window holding NaNs), and the index starts at the window's first position
inside the input (an all -inf window points there). Indices are flat into the input's
H * W plane.

Max pooling backward (`max_pool2d_with_indices_backward`): each input element sums, in
output order, the gradients of the outputs whose window spans it and whose saved index
is its own flat position (ATen's CUDA kernel: the candidate outputs along a dim are a
static range of floor((k - 1) * d / s) + 1 positions, two for resnet's kernel 3 stride 2).

Average pooling (`avg_pool2d`, `avg_pool2d_backward`): the window's sum over the elements
inside the input, divided by ATen's divisor (the window clipped to the padded input with
`count_include_pad`, to the input without it, or `divisor_override`); the backward sums
each candidate output's gradient divided by that output's divisor. Sums are in float32 for
half types, as ATen's CUDA kernels.

Adaptive average pooling (`_adaptive_avg_pool2d` and its backward): output o's window is
[floor(o * H / OH), ceil((o + 1) * H / OH)), unrolled to the widest window with a bound
per element where widths differ; the sum is divided by its rows, then by its columns, as
ATen does. The backward reads the outputs an input position fed, the same ranges read the
other way (OH over H), each gradient divided by its window's rows and columns.

A window larger than `MAX_WINDOW` loads (a global pool, say) stays an ATen call: its
unrolled code would be too long to compile well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from compiler.codegen.common import (
    Index,
    Unsupported,
    Var,
    cast,
    compute_dtype,
    literal,
    paren,
    tl_dtype,
)
from compiler.codegen.writer import Writer
from compiler.ir import meta

MAX_WINDOW = 64  # loads per element (kh * kw forward, candidates backward) a kernel unrolls

Pos = int | str  # a position along a dim: a literal when the index there is one


@dataclass(frozen=True)
class Window:
    """A pooling's geometry along H and W: (kernel, stride, padding, dilation) per dim,
    input sizes `size` and output sizes `out`."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    size: tuple[int, int]
    out: tuple[int, int]

    def candidates(self, dim: int) -> int:
        """Outputs along `dim` whose window may span one input position."""
        return (self.kernel[dim] - 1) * self.dilation[dim] // self.stride[dim] + 1


def _pair(value: object, default: Sequence[int]) -> tuple[int, int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]  # type: ignore[arg-type]
    if not values:
        values = list(default)
    return (int(values[0]), int(values[-1]))


def window(inp: fx.Node, args: Sequence[object], out_shape: tuple[int, ...]) -> Window:
    """The window of a pooling of `inp` with ATen's (kernel_size, stride, padding,
    dilation) arguments `args` (missing ones at ATen's defaults)."""
    kernel = _pair(args[0], ())
    stride = _pair(args[1] if len(args) > 1 else [], kernel)
    padding = _pair(args[2] if len(args) > 2 else 0, ())
    dilation = _pair(args[3] if len(args) > 3 else 1, ())
    shape = meta(inp).shape
    return Window(kernel, stride, padding, dilation, (shape[-2], shape[-1]), (out_shape[-2], out_shape[-1]))


def _forward_window(pool: fx.Node) -> Window:
    return window(pool.args[0], pool.args[1:5], meta(pool)[0].shape)


def _backward_window(node: fx.Node) -> Window:
    return window(node.args[1], node.args[2:6], meta(node.args[0]).shape)


def _avg_window(node: fx.Node) -> Window:
    return window(node.args[0], node.args[1:4], meta(node).shape)


def _avg_backward_window(node: fx.Node) -> Window:
    return window(node.args[1], node.args[2:5], meta(node.args[0]).shape)


def _refusal(inp: fx.Node, loads: int) -> str | None:
    m = meta(inp)
    if len(m.shape) not in (3, 4):
        return f"pooling of a {len(m.shape)}-d input"
    if not m.dtype.is_floating_point:
        return f"pooling of {m.dtype} values"
    if loads > MAX_WINDOW:
        return f"a pooling window of {loads} loads (at most {MAX_WINDOW} unrolled)"
    return None


def _check(reason: str | None) -> None:
    if reason is not None:
        raise Unsupported(reason)


def forward_refusal(pool: fx.Node) -> str | None:
    """Why a `max_pool2d_with_indices` stays an ATen call, or None."""
    kernel = _forward_window(pool).kernel
    return _refusal(pool.args[0], kernel[0] * kernel[1])


def piece_refusal(piece: fx.Node) -> str | None:
    """Why a getitem of a `max_pool2d_with_indices` is not computed: its pooling's refusal."""
    return forward_refusal(piece.args[0])


def backward_refusal(node: fx.Node) -> str | None:
    """Why a `max_pool2d_with_indices_backward` stays an ATen call, or None."""
    win = _backward_window(node)
    return _refusal(node.args[1], win.candidates(0) * win.candidates(1))


def avg_refusal(node: fx.Node) -> str | None:
    """Why an `avg_pool2d` stays an ATen call, or None."""
    kernel = _avg_window(node).kernel
    return _refusal(node.args[0], kernel[0] * kernel[1])


def avg_backward_refusal(node: fx.Node) -> str | None:
    """Why an `avg_pool2d_backward` stays an ATen call, or None."""
    win = _avg_backward_window(node)
    return _refusal(node.args[1], win.candidates(0) * win.candidates(1))


def _affine(e: str, scale: int, offset: int) -> Pos:
    """`e * scale + offset`, a literal when `e` is one."""
    if e.lstrip("-").isdigit():
        return int(e) * scale + offset
    term = e if scale == 1 else f"{paren(e)} * {scale}"
    if offset == 0:
        return term
    return f"{term} + {offset}" if offset > 0 else f"{term} - {-offset}"


def _inside(pos: Pos, size: int, low: int, high: int) -> str | bool:
    """Condition that `pos`, known to lie in [low, high], is in [0, size): a bool when the
    range decides it."""
    if isinstance(pos, int) or low >= size or high < 0:
        return 0 <= low <= high < size if isinstance(pos, int) else False
    conds = ([] if low >= 0 else [f"({pos} >= 0)"]) + ([] if high < size else [f"({pos} < {size})"])
    return " & ".join(conds) or True


def _flat(row: Pos, col: Pos, width: int) -> Pos:
    if isinstance(row, int) and isinstance(col, int):
        return row * width + col
    r = str(row) if isinstance(row, int) else paren(row)
    return f"{r} * {width} + {paren(str(col))}" if width != 1 else f"{r} + {paren(str(col))}"


# ---- windows and candidates -----------------------------------------------------------------


def _window_positions(win: Window, idx: Index) -> list[tuple[Pos, Pos, list[str]]]:
    """(row, col, conditions that it is inside the input) of each window element of the
    output at `idx`, in ATen's order (rows, then columns); elements known to be outside
    are left out."""
    per_dim = []
    for d in (0, 1):
        found = []
        for i in range(win.kernel[d]):
            offset = i * win.dilation[d] - win.padding[d]
            pos = _affine(idx[d - 2], win.stride[d], offset)
            low = pos if isinstance(pos, int) else offset
            inside = _inside(pos, win.size[d], low, (win.out[d] - 1) * win.stride[d] + offset)
            if inside is not False:
                found.append((pos, [inside] if isinstance(inside, str) else []))
        per_dim.append(found)
    return [(r, c, rc + cc) for r, rc in per_dim[0] for c, cc in per_dim[1]]


def _candidates(win: Window, idx: Index) -> list[tuple[Pos, Pos, list[str]]]:
    """(output row, output col, conditions that its window spans the input element at
    `idx`) of each output whose window may span it, in output order."""
    per_dim = []
    for d in (0, 1):
        pos = _affine(idx[d - 2], 1, win.padding[d])  # the element in padded coordinates
        stride, span, n = win.stride[d], (win.kernel[d] - 1) * win.dilation[d], win.candidates(d)
        top = pos // stride if isinstance(pos, int) else f"{paren(pos)} // {stride}"
        top_low, top_high = win.padding[d] // stride, (win.size[d] - 1 + win.padding[d]) // stride
        found = []
        for back in range(n - 1, -1, -1):  # ascending outputs
            if isinstance(top, int):
                o = top - back
                if 0 <= o < win.out[d] and pos - o * stride <= span:  # type: ignore[operator]
                    found.append((o, []))
                continue
            o = f"{top} - {back}" if back else top
            conds = [f"({o} >= 0)"] if top_low - back < 0 else []
            if top_high - back >= win.out[d]:
                conds.append(f"({o} < {win.out[d]})")
            if back * stride + stride - 1 > span:  # else always inside the span
                conds.append(f"({paren(str(pos))} - ({o}) * {stride} <= {span})")
            found.append((o, conds))
        per_dim.append(found)
    return [(r, c, rc + cc) for r, rc in per_dim[0] for c, cc in per_dim[1]]


def _guarded(w: Writer, conds: list[str], mask: str) -> tuple[str | None, str]:
    """(the variable holding `conds` or None when there are none, `mask` narrowed by it)."""
    if not conds:
        return None, mask
    inside = w.tmp(" & ".join(w.tmp(c, prefix="mask") for c in conds), prefix="mask")
    return inside, w.tmp(f"{mask} & {inside}", prefix="mask")


def _at(idx: Index, row: Pos, col: Pos) -> Index:
    return (*idx[:-2], str(row), str(col))


def _window_reads(inp: fx.Node, win: Window, idx: Index) -> list[tuple[fx.Node, Index]]:
    return [(inp, _at(idx, r, c)) for r, c, _ in _window_positions(win, idx)]


def _candidate_reads(tensors: Sequence[fx.Node], win: Window, idx: Index) -> list[tuple[fx.Node, Index]]:
    return [(t, _at(idx, r, c)) for r, c, _ in _candidates(win, idx) for t in tensors]


# ---- max pooling ----------------------------------------------------------------------------


def _first_inside(start: Pos, pad: int, dilation: int) -> Pos:
    """The first position inside the input of a window dim starting at `start` (ATen steps
    a start left of the input right by the dilation until it is inside)."""
    if isinstance(start, int):
        return start if start >= 0 else start + (-start + dilation - 1) // dilation * dilation
    if pad == 0:
        return start
    if dilation == 1:
        return f"tl.maximum({start}, 0)"
    s = paren(start)
    return f"tl.where({s} < 0, {s} + ((-{s} + {dilation - 1}) // {dilation}) * {dilation}, {s})"


def _max_and_argmax(w: Writer, pool: fx.Node, idx: Index, mask: str) -> tuple[str, str]:
    """Variables holding the window's maximum (compute dtype) and its flat index (int64)."""
    _check(forward_refusal(pool))
    win = _forward_window(pool)
    x = pool.args[0]
    cd = compute_dtype(meta(x).dtype)
    row0 = _first_inside(_affine(idx[-2], win.stride[0], -win.padding[0]), win.padding[0], win.dilation[0])
    col0 = _first_inside(_affine(idx[-1], win.stride[1], -win.padding[1]), win.padding[1], win.dilation[1])
    best = literal(float("-inf"), cd)
    first = _flat(row0, col0, win.size[1])
    arg = w.tmp(f"tl.full([1], {first}, tl.int64)" if isinstance(first, int) else f"({first}).to(tl.int64)")
    for row, col, conds in _window_positions(win, idx):
        inside, inner = _guarded(w, conds, mask)
        v = cast(Var(w.value(x, _at(idx, row, col), inner), cd), cd)
        if inside is not None:
            v = w.tmp(f"tl.where({inside}, {v}, {literal(float('-inf'), cd)})")
        take = w.tmp(f"({v} > {best}) | ({v} != {v})")
        best = w.tmp(f"tl.where({take}, {v}, {best})")
        arg = w.tmp(f"tl.where({take}, {_flat(row, col, win.size[1])}, {arg})")
    return best, arg


def _values(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    best, _ = _max_and_argmax(w, node.args[0], idx, mask)
    return best


def _indices(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    _, arg = _max_and_argmax(w, node.args[0], idx, mask)
    return arg


def _forward_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    pool = node.args[0]
    return _window_reads(pool.args[0], _forward_window(pool), idx)


def _backward(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    _check(backward_refusal(node))
    grad, indices = node.args[0], node.args[7]
    cd = compute_dtype(meta(node).dtype)
    win = _backward_window(node)
    here = paren(str(_flat(idx[-2], idx[-1], win.size[1])))
    acc = literal(0, cd)
    for row, col, conds in _candidates(win, idx):
        inside, inner = _guarded(w, conds, mask)
        at = _at(idx, row, col)
        g = cast(Var(w.value(grad, at, inner), compute_dtype(meta(grad).dtype)), cd)
        taken = w.tmp(f"{w.value(indices, at, inner)} == {here}", prefix="mask")
        if inside is not None:
            taken = w.tmp(f"{inside} & {taken}", prefix="mask")
        acc = w.tmp(f"{acc} + tl.where({taken}, {g}, {literal(0, cd)})")
    return acc


def _backward_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    return _candidate_reads((node.args[0], node.args[7]), _backward_window(node), idx)


# ---- average pooling ------------------------------------------------------------------------


def _avg_options(args: Sequence[object], first: int) -> tuple[bool, int | None]:
    """(count_include_pad, divisor_override) from `args[first:]` (ceil_mode is in the shapes)."""
    rest = list(args[first:])
    include_pad = bool(rest[1]) if len(rest) > 1 else True
    override = rest[2] if len(rest) > 2 else None
    return include_pad, None if override is None else int(override)  # type: ignore[call-overload]


def _count(win: Window, d: int, o: str, include_pad: bool) -> Pos:
    """The elements ATen divides by along dim `d` for output `o`: the window clipped to the
    padded input (`include_pad`) or to the input."""
    k, size, pad, stride = win.kernel[d], win.size[d], win.padding[d], win.stride[d]
    start = _affine(o, stride, -pad)
    if isinstance(start, int):
        if include_pad:
            return min(start + k, size + pad) - start
        return min(start + k, size) - max(start, 0)
    last = (win.out[d] - 1) * stride - pad  # the largest start
    end_limit = size + pad if include_pad else size
    end = f"{start} + {k}" if last + k <= end_limit else f"tl.minimum({start} + {k}, {end_limit})"
    begin = start if include_pad or pad == 0 else f"tl.maximum({start}, 0)"
    if end == f"{start} + {k}" and begin == start:
        return k
    return f"{end} - ({begin})" if begin == start else f"{end} - {begin}"


def _divisor(w: Writer, win: Window, idx: Index, include_pad: bool, override: int | None,
             cd: torch.dtype) -> str:
    """ATen's divisor of the window of the output at `idx`, in compute dtype `cd`."""
    if override is not None:
        return literal(float(override), cd)
    rows, cols = (_count(win, d, idx[d - 2], include_pad) for d in (0, 1))
    if isinstance(rows, int) and isinstance(cols, int):
        return literal(float(rows * cols), cd)
    return w.tmp(f"({paren(str(rows))} * {paren(str(cols))}).to({tl_dtype(cd)})")


def _avg(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    _check(avg_refusal(node))
    x = node.args[0]
    cd = compute_dtype(meta(node).dtype)
    win = _avg_window(node)
    acc = literal(0, cd)
    for row, col, conds in _window_positions(win, idx):
        inside, inner = _guarded(w, conds, mask)
        v = cast(Var(w.value(x, _at(idx, row, col), inner), compute_dtype(meta(x).dtype)), cd)
        acc = w.tmp(f"{acc} + {v}" if inside is None else f"{acc} + tl.where({inside}, {v}, {literal(0, cd)})")
    return f"{acc} / {_divisor(w, win, idx, *_avg_options(node.args, 4), cd)}"


def _avg_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    return _window_reads(node.args[0], _avg_window(node), idx)


def _avg_backward(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    _check(avg_backward_refusal(node))
    grad = node.args[0]
    cd = compute_dtype(meta(node).dtype)
    win = _avg_backward_window(node)
    options = _avg_options(node.args, 5)
    acc = literal(0, cd)
    for row, col, conds in _candidates(win, idx):
        inside, inner = _guarded(w, conds, mask)
        at = _at(idx, row, col)
        g = cast(Var(w.value(grad, at, inner), compute_dtype(meta(grad).dtype)), cd)
        share = w.tmp(f"{g} / {_divisor(w, win, at, *options, cd)}")
        acc = w.tmp(f"{acc} + {share}" if inside is None else f"{acc} + tl.where({inside}, {share}, {literal(0, cd)})")
    return acc


def _avg_backward_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    return _candidate_reads((node.args[0],), _avg_backward_window(node), idx)


# ---- adaptive average pooling ---------------------------------------------------------------


def _adaptive_range(o: str, size: int, out: int) -> tuple[Pos, Pos]:
    """(start, end) of the window of output `o` along a dim of `size` pooled to `out`:
    floor(o * size / out) and ceil((o + 1) * size / out), as ATen's."""
    if o.lstrip("-").isdigit():
        k = int(o)
        return k * size // out, ((k + 1) * size + out - 1) // out
    return f"({paren(o)} * {size}) // {out}", f"(({paren(o)} + 1) * {size} + {out - 1}) // {out}"


def _adaptive_widest(size: int, out: int) -> int:
    """The widest window of a dim of `size` pooled to `out` (and, read the other way, the
    most outputs one input position feeds)."""
    return max(((k + 1) * size + out - 1) // out - k * size // out for k in range(out))


def _adaptive_positions(size: int, out: int, o: str) -> list[tuple[Pos, list[str]]]:
    """(position, conditions that it is inside the window) of each element of the window of
    output `o` (or, with `size` and `out` swapped, of each output input position `o` feeds)."""
    start, end = _adaptive_range(o, size, out)
    width = _adaptive_widest(size, out)
    uniform = size % out == 0
    found: list[tuple[Pos, list[str]]] = []
    for i in range(width):
        if isinstance(start, int):
            if start + i < end:  # type: ignore[operator]
                found.append((start + i, []))
            continue
        pos = f"{start} + {i}" if i else start
        found.append((pos, [] if uniform or i == 0 else [f"({pos} < {end})"]))  # never empty
    return found


def _adaptive_window(node: fx.Node, inp: fx.Node, out: fx.Node, idx: Index) -> list[tuple[Pos, Pos, list[str]]]:
    shape, pooled = meta(inp).shape, meta(out).shape
    rows, cols = (_adaptive_positions(shape[d], pooled[d], idx[d]) for d in (-2, -1))
    return [(r, c, rc + cc) for r, rc in rows for c, cc in cols]


def _adaptive_count(o: str, size: int, out: int) -> str:
    start, end = _adaptive_range(o, size, out)
    if isinstance(start, int):
        return str(end - start)  # type: ignore[operator]
    return str(size // out) if size % out == 0 else f"({end} - {start})"


def _adaptive_refusal(inp: fx.Node, pooled: tuple[int, ...], size: tuple[int, ...], out: tuple[int, ...]) -> str | None:
    """Why an adaptive pooling of `inp` stays an ATen call: unrolled windows of dims of
    `size` pooled to `out`."""
    if len(pooled) not in (3, 4) or 0 in pooled[-2:]:
        return f"adaptive pooling to {pooled}"
    return _refusal(inp, _adaptive_widest(size[-2], out[-2]) * _adaptive_widest(size[-1], out[-1]))


def adaptive_refusal(node: fx.Node) -> str | None:
    """Why an `_adaptive_avg_pool2d` stays an ATen call, or None."""
    shape, pooled = meta(node.args[0]).shape, meta(node).shape
    return _adaptive_refusal(node.args[0], pooled, shape, pooled)


def adaptive_backward_refusal(node: fx.Node) -> str | None:
    """Why an `_adaptive_avg_pool2d_backward` stays an ATen call, or None (the outputs one
    input position fed are unrolled as a window's elements are)."""
    shape, pooled = meta(node).shape, meta(node.args[0]).shape
    return _adaptive_refusal(node.args[1], pooled, pooled, shape)


def _adaptive(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    _check(adaptive_refusal(node))
    x = node.args[0]
    cd = compute_dtype(meta(node).dtype)
    acc = literal(0, cd)
    for row, col, conds in _adaptive_window(node, x, node, idx):
        inside, inner = _guarded(w, conds, mask)
        v = cast(Var(w.value(x, _at(idx, row, col), inner), compute_dtype(meta(x).dtype)), cd)
        acc = w.tmp(f"{acc} + {v}" if inside is None else f"{acc} + tl.where({inside}, {v}, {literal(0, cd)})")
    shape, pooled = meta(x).shape, meta(node).shape
    rows, cols = (_adaptive_count(idx[d], shape[d], pooled[d]) for d in (-2, -1))
    return f"{acc} / {rows} / {cols}"  # ATen divides twice: the same rounding


def _adaptive_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    x = node.args[0]
    return [(x, _at(idx, r, c)) for r, c, _ in _adaptive_window(node, x, node, idx)]


def _adaptive_backward(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    _check(adaptive_backward_refusal(node))
    grad = node.args[0]
    cd = compute_dtype(meta(node).dtype)
    shape, pooled = meta(node).shape, meta(grad).shape
    acc = literal(0, cd)
    for row, col, conds in _adaptive_window(node, grad, node, idx):  # the outputs it fed
        inside, inner = _guarded(w, conds, mask)
        at = _at(idx, row, col)
        g = cast(Var(w.value(grad, at, inner), compute_dtype(meta(grad).dtype)), cd)
        rows, cols = (_adaptive_count(str(o), shape[d], pooled[d]) for o, d in ((row, -2), (col, -1)))
        share = w.tmp(f"{g} / {rows} / {cols}")
        acc = w.tmp(f"{acc} + {share}" if inside is None else f"{acc} + tl.where({inside}, {share}, {literal(0, cd)})")
    return acc


def _adaptive_backward_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    grad = node.args[0]
    return [(grad, _at(idx, r, c)) for r, c, _ in _adaptive_window(node, grad, node, idx)]


# The forward's pieces: (emit, reads, refuse) of its values and of its indices.
MAX_PIECES = ((_values, _forward_reads, piece_refusal), (_indices, _forward_reads, piece_refusal))
# (emit, reads, refuse) of each single-result pooling op.
OPS = {
    "max_pool2d_with_indices_backward": (_backward, _backward_reads, backward_refusal),
    "avg_pool2d": (_avg, _avg_reads, avg_refusal),
    "avg_pool2d_backward": (_avg_backward, _avg_backward_reads, avg_backward_refusal),
    "_adaptive_avg_pool2d": (_adaptive, _adaptive_reads, adaptive_refusal),
    "_adaptive_avg_pool2d_backward": (_adaptive_backward, _adaptive_backward_reads,
                                      adaptive_backward_refusal),
}
