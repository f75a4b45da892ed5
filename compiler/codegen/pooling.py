"""2-D max pooling as loads at computed positions: each value a small static window.

Forward (`max_pool2d_with_indices`, a tuple of results): its values and its indices are
each computed at an output index by one unrolled loop over the kernel's kh * kw window
(its getitems are the rules `VALUES` and `INDICES`; the tuple itself is never computed or
stored). Both walk the window in the same order with the same expressions, so a kernel
that stores both emits the loop once (the Writer reuses every expression in scope). As
ATen's CPU and CUDA kernels: positions outside the input are skipped, an element replaces
the running maximum when it is greater or NaN (so the first maximum wins ties and the last
NaN wins a window holding NaNs), and the index starts at the window's first position
inside the input (an all -inf window points there). Indices are flat into the input's
H * W plane.

Backward (`max_pool2d_with_indices_backward`): each input element sums, in output order,
the gradients of the outputs whose window spans it and whose saved index is its own flat
position (ATen's CUDA kernel: the candidate outputs along a dim are a static range of
floor((k - 1) * d / s) + 1 positions, two for resnet's kernel 3 stride 2).

A window larger than `MAX_WINDOW` loads (a global pool, say) stays an ATen call: its
unrolled code would be too long to compile well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import fx

from compiler.codegen.common import Index, Unsupported, Var, cast, compute_dtype, literal, paren
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
    return window(pool.args[0], pool.args[1:], meta(pool)[0].shape)


def _backward_window(node: fx.Node) -> Window:
    return window(node.args[1], node.args[2:6], meta(node.args[0]).shape)


def _refusal(inp: fx.Node, loads: int) -> str | None:
    m = meta(inp)
    if len(m.shape) not in (3, 4):
        return f"max pooling of a {len(m.shape)}-d input"
    if not m.dtype.is_floating_point:
        return f"max pooling of {m.dtype} values"
    if loads > MAX_WINDOW:
        return f"a pooling window of {loads} loads (at most {MAX_WINDOW} unrolled)"
    return None


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


# ---- forward --------------------------------------------------------------------------------


def _window_positions(pool: fx.Node, idx: Index) -> list[tuple[Pos, Pos, list[str]]]:
    """(row, col, conditions that it is inside the input) of each window element of the
    output at `idx`, in ATen's order (rows, then columns); elements known to be outside
    are left out."""
    win = _forward_window(pool)
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
    reason = forward_refusal(pool)
    if reason is not None:
        raise Unsupported(reason)
    win = _forward_window(pool)
    x = pool.args[0]
    cd = compute_dtype(meta(x).dtype)
    lead = idx[:-2]
    row0 = _first_inside(_affine(idx[-2], win.stride[0], -win.padding[0]), win.padding[0], win.dilation[0])
    col0 = _first_inside(_affine(idx[-1], win.stride[1], -win.padding[1]), win.padding[1], win.dilation[1])
    best = literal(float("-inf"), cd)
    first = _flat(row0, col0, win.size[1])
    arg = w.tmp(f"tl.full([1], {first}, tl.int64)" if isinstance(first, int) else f"({first}).to(tl.int64)")
    for row, col, conds in _window_positions(pool, idx):
        at = (*lead, str(row), str(col))
        if conds:
            inside = w.tmp(" & ".join(w.tmp(c, prefix="mask") for c in conds), prefix="mask")
            v = w.value(x, at, w.tmp(f"{mask} & {inside}", prefix="mask"))
            v = w.tmp(f"tl.where({inside}, {cast(Var(v, cd), cd)}, {literal(float('-inf'), cd)})")
        else:
            v = cast(Var(w.value(x, at, mask), cd), cd)
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
    return [(pool.args[0], (*idx[:-2], str(r), str(c))) for r, c, _ in _window_positions(pool, idx)]


# ---- backward -------------------------------------------------------------------------------


def _candidates(node: fx.Node, idx: Index) -> list[tuple[Pos, Pos, list[str]]]:
    """(output row, output col, conditions that its window spans the input element at
    `idx`) of each output that may have taken it, in output order."""
    win = _backward_window(node)
    per_dim = []
    for d in (0, 1):
        pos = _affine(idx[d - 2], 1, win.padding[d])  # the element in padded coordinates
        span = (win.kernel[d] - 1) * win.dilation[d]
        n = win.candidates(d)
        top = pos // win.stride[d] if isinstance(pos, int) else f"{paren(pos)} // {win.stride[d]}"
        found = []
        for t in range(n):
            back = n - 1 - t
            o = top - back if isinstance(top, int) else (f"{top} - {back}" if back else top)
            if isinstance(o, int):
                if not (0 <= o < win.out[d] and pos - o * win.stride[d] <= span):
                    continue
                found.append((o, []))
                continue
            conds = [f"({o} >= 0)"] if back else []
            conds.append(f"({o} < {win.out[d]})")
            if back * win.stride[d] + win.stride[d] - 1 > span:  # else always inside the span
                conds.append(f"({paren(str(pos))} - ({o}) * {win.stride[d]} <= {span})")
            found.append((o, conds))
        per_dim.append(found)
    return [(r, c, rc + cc) for r, rc in per_dim[0] for c, cc in per_dim[1]]


def _backward(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    reason = backward_refusal(node)
    if reason is not None:
        raise Unsupported(reason)
    grad, indices = node.args[0], node.args[7]
    cd = compute_dtype(meta(node).dtype)
    win = _backward_window(node)
    here = _flat(idx[-2], idx[-1], win.size[1])
    acc = literal(0, cd)
    for row, col, conds in _candidates(node, idx):
        at = (*idx[:-2], str(row), str(col))
        cond = " & ".join(conds)
        inner = w.tmp(f"{mask} & {cond}", prefix="mask") if cond else mask
        g = cast(Var(w.value(grad, at, inner), compute_dtype(meta(grad).dtype)), cd)
        taken = f"{w.value(indices, at, inner)} == {paren(str(here))}"
        acc = w.tmp(f"{acc} + tl.where({cond + ' & ' if cond else ''}({taken}), {g}, {literal(0, cd)})")
    return acc


def _backward_reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    grad, indices = node.args[0], node.args[7]
    reads = []
    for row, col, _ in _candidates(node, idx):
        at = (*idx[:-2], str(row), str(col))
        reads += [(grad, at), (indices, at)]
    return reads


# The forward's pieces: (emit, reads, refuse) of its values and of its indices.
PIECES = ((_values, _forward_reads, piece_refusal), (_indices, _forward_reads, piece_refusal))
BACKWARD = (_backward, _backward_reads, backward_refusal)
