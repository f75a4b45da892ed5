"""The reduction kind: XBLOCK rows per program, each reduced over RBLOCK-wide chunks.

Its variants, each one function over a `RowFrame` (`compiler.codegen.reduction`) and one
`Variant` entry in `VARIANTS` below (this is the one list of them: docs/contracts.md,
compiler/README.md and the kinds' registry point here); the source depends on the variant,
never on the block sizes:
- `looped`: one loop over the reduced elements per dependency level of the reductions
  (layer norm: mean, then variance), plus one more for full-size outputs;
- `persistent`: RBLOCK covers the whole reduced extent, a row lives in registers and
  every input is read once;
- `online`: like looped, but a max and the sum of exp(x - max) that follows it are
  computed in one pass with a running rescale (softmax, log_softmax, cross-entropy).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import fx

from compiler.codegen.access import Reads
from compiler.codegen.common import Index
from compiler.codegen.kinds.base import (
    MAX_BLOCK_NUMEL,
    WARPS,
    BlockLimits,
    Config,
    KernelKind,
    Point,
    clip,
    next_pow2,
    prune_block,
    validate_keys,
    writer,
)
from compiler.codegen.reduction import (
    Reducer,
    ReductionInfo,
    RowFrame,
    frame_indices,
    member_row_index,
    reduced_index,
    reduction_info,
    row_shapes,
)
from compiler.codegen.writer import Generated, Writer
from compiler.ir import SPLIT_STAGE, Domain, KernelGroup, base_name, meta

MAX_ALONGSIDE = 4  # anchors a kernel of first stages takes beside one another
PERSISTENT_MAX = 4096  # widest reduced extent (elements) kept in registers by default
# The tuning space's domains; clipped per kernel.
XBLOCKS = (1, 2, 4, 8, 16, 32, 64, 128)
LOOPED_RBLOCKS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def persistent(frame: RowFrame) -> None:
    """Every reduced element of a row in one block: each input is read once."""
    full = frame.open_rows(loop=False)
    for level in frame.levels:
        for n in level:
            r = frame.reducers[n]
            frame.set_anchor(n, r.finish(r.value(full), "rindex"), full)
    frame.store_full(full)


def looped(frame: RowFrame) -> None:
    """One loop over a row's reduced elements per dependency level, one more for the
    members as large as the domain."""
    _looped(frame, {})


def online(frame: RowFrame) -> None:
    """Looped, with each sum(exp(x - amax(x))) computed in its amax's loop."""
    _looped(frame, _online_pairs(frame.infos))


def _looped(frame: RowFrame, pairs: dict[fx.Node, fx.Node]) -> None:
    for level in frame.levels:
        nodes = [n for n in level if n not in pairs]
        if nodes:
            _loop_level(frame, nodes, pairs)
    if frame.full_members:
        frame.store_full(frame.open_rows(loop=True))
        frame.w.pop()


def _loop_level(frame: RowFrame, nodes: list[fx.Node], pairs: dict[fx.Node, fx.Node]) -> None:
    """One loop reducing `nodes`; a max with paired sums (`pairs`: {sum: max}) runs online."""
    w, reducers = frame.w, frame.reducers
    maxes = set(pairs.values())
    fused = [s for s, m in pairs.items() if m in nodes]
    for n in nodes:
        if n in maxes:  # online: one running max and sum per row
            w.emit(f"{reducers[n].acc} = tl.full([XBLOCK, 1], float(\"-inf\"), tl.float32)")
            w.emit(f"nan{reducers[n].k} = tl.zeros([XBLOCK, RBLOCK], tl.int1)")
        else:
            reducers[n].init()
    for s in fused:
        w.emit(f"sum{reducers[s].k} = tl.zeros([XBLOCK, 1], tl.float32)")
    full = frame.open_rows(loop=True)
    for n in nodes:
        r = reducers[n]
        v = r.value(full)
        if n in maxes:
            _online_step(w, r, v, [reducers[s] for s in fused if pairs[s] is n])
        else:
            r.accumulate(v)
    w.pop()
    rows = frame.row_index()
    for n in nodes:
        r = reducers[n]
        if n not in maxes:
            frame.set_anchor(n, r.finish(r.acc, r.idx_acc), rows)
            continue
        nan = w.tmp(f"tl.max(nan{r.k}.to(tl.int32), 1)[:, None] != 0")
        frame.set_anchor(n, w.tmp(f"tl.where({nan}, float(\"nan\"), {r.acc})"), rows)
        for s in fused:
            if pairs[s] is n:
                total = f"tl.where({nan}, float(\"nan\"), sum{reducers[s].k})"
                frame.set_anchor(s, w.tmp(total), rows)


def _online_pairs(infos: dict[fx.Node, ReductionInfo]) -> dict[fx.Node, fx.Node]:
    """sum(exp(x - amax(x))) reductions paired with their amax: {sum node: max node}."""
    pairs = {}
    for node, info in infos.items():
        if info.op != "sum":
            continue
        e = info.source
        if not (isinstance(e, fx.Node) and base_name(e) == "exp" and isinstance(e.args[0], fx.Node)):
            continue
        s = e.args[0]
        if base_name(s) != "sub" or len(s.args) != 2 or s.kwargs.get("alpha", 1) != 1:
            continue
        x, m = s.args
        if m in infos and infos[m].op == "max" and infos[m].source is x and infos[m].dims == info.dims:
            pairs[node] = m
    return pairs


def _online_step(w: Writer, r: Reducer, v: str, sums: list[Reducer]) -> None:
    """Running row max, and the row sums of exp(x - max) rescaled when the max grows:
    one exp per element (masked lanes hold -inf, so they add exp(-inf) = 0). `tl.max`
    skips NaN: lanes that saw one are flagged, and the row's max and sums become NaN
    after the loop (as in eager, where amax is NaN and so is every exp(x - amax))."""
    w.emit(f"nan{r.k} = nan{r.k} | ({v} != {v})")
    new = w.tmp(f"tl.maximum({r.acc}, tl.max({v}, 1)[:, None])")
    for s in sums:
        w.emit(f"sum{s.k} = tl.where({new} == float(\"-inf\"), 0.0, sum{s.k} * tl.exp({r.acc} - {new})"
               f" + tl.sum(tl.exp({v} - {new}), 1)[:, None])")
    w.emit(f"{r.acc} = {new}")


@dataclass(frozen=True)
class Variant:
    """One reduction variant: its body, and what its config and tuning space need."""

    body: Callable[[RowFrame], None]
    whole_rows: bool = False  # RBLOCK must cover the reduced extent (rnumel)
    opt_in: bool = False  # in the tuning space only when the schedule already picked it


# Declaration order is the order schedules' error messages list; `TIE_ORDER` breaks ties
# (a variant missing from it ranks after those in it).
VARIANTS = {
    "looped": Variant(looped),
    "persistent": Variant(persistent, whole_rows=True),
    # the heuristic never picks it (on the H200 looped won: its second pass hits L2)
    "online": Variant(online, opt_in=True),
}
TIE_ORDER = ("persistent", "online", "looped")


def config_for(group: KernelGroup, gpu: bool) -> Point:
    """Variant and config of a reduction: persistent rows when they fit, else looped."""
    dom = group.domain
    x, r = dom.xnumel, dom.rnumel
    rblock_full = next_pow2(r)
    elem_bytes = max(group.dtype.itemsize, 4)
    if not dom.inner and r > 1:
        xblock, rblock, warps = _outer_blocks(x, r) if gpu else _outer_blocks_interpreted(x, r)
        variant = "persistent" if rblock >= r else "looped"
        return variant, {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps, "num_stages": 1}
    if rblock_full * elem_bytes <= PERSISTENT_MAX * 4:
        xblock = max(1, min(next_pow2(x), 1024 // rblock_full if rblock_full <= 1024 else 1))
        warps = min(16, max(1, xblock * rblock_full // 512))
        return "persistent", {"XBLOCK": xblock, "RBLOCK": rblock_full,
                              "num_warps": warps if gpu else 1, "num_stages": 1}
    # Wide rows: looped, 4096 at a time. On the H200 (gpu_check sweep, 8192x32000 bf16
    # cross-entropy) this beat the online variant: the second pass over a row hits L2.
    return "looped", {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16 if gpu else 1, "num_stages": 1}


def _outer_blocks(x: int, r: int) -> tuple[int, int, int]:
    """XBLOCK, RBLOCK and warps of a reduction over outer dims (neighbouring x are
    contiguous: column sums, channels-last statistics, a split reduction's first stage)
    on a GPU: tiles of about 512 elements, 4 per thread, as Inductor's outer-reduction
    rule has them, so that a kernel of several loads keeps few registers. 64x64 tiles held
    167-226 registers a thread in the LayerNorm backward's column sums at GPT-2 and ViT
    sizes for sm_90 (8-12 warps an SM), against 40-56 here."""
    xs = next_pow2(x)
    if xs <= 1024:  # few columns: narrow blocks so that there are programs enough
        xblock = min(xs, max(2, min(8, xs // 128)))
        rblock = min(next_pow2(r), 64)
    elif xs <= 8 * 4096:
        xblock, rblock = 16, 32
    else:
        xblock = max(64, min(128, next_pow2(xs // 4096)))
        rblock = 512 // xblock
    rblock = min(rblock, next_pow2(r))
    warps = min(8, max(2, next_pow2(max(1, xblock * rblock // 128))))
    return xblock, rblock, warps


def _outer_blocks_interpreted(x: int, r: int) -> tuple[int, int, int]:
    """The same on the interpreter, where larger blocks mean fewer programs to walk in
    Python: x the wide side, 16 to 64 columns."""
    xblock = min(next_pow2(x), max(16, min(64, next_pow2(x) // 128)))
    rblock = min(next_pow2(r), 4096 // xblock, 64 if x >= 64 else 512)
    return xblock, max(rblock, 1), 1


class ReductionKind(KernelKind):
    name = "reduction"
    group_kind = "reduction"
    config_keys = ("XBLOCK", "RBLOCK", "num_warps", "num_stages")
    anchor_op = "reduction"
    siblings = True  # reductions of the same producers' values share one pass over them

    @property
    def variants(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(VARIANTS)

    @property
    def tie_order(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(v for v in TIE_ORDER if v in VARIANTS) + tuple(v for v in VARIANTS if v not in TIE_ORDER)

    def validate(self, variant: str, config: dict[str, Any], sizes: dict[str, int], name: str) -> None:
        validate_keys(self.config_keys, config, name)
        if config["XBLOCK"] * config["RBLOCK"] > MAX_BLOCK_NUMEL:
            raise ValueError(f"{name}: XBLOCK*RBLOCK exceeds {MAX_BLOCK_NUMEL}")
        if VARIANTS[variant].whole_rows and config["RBLOCK"] < sizes.get("rnumel", 0):
            raise ValueError(f"{name}: {variant} needs RBLOCK >= rnumel ({sizes['rnumel']}), "
                             f"got {config['RBLOCK']}")

    def heuristic(self, group: KernelGroup, gpu: bool, arch: str = "") -> Point:
        return config_for(group, gpu)

    def alongside(self, group: KernelGroup, node: fx.Node) -> bool:
        """A split reduction's first stage joins a kernel of first stages (of the same
        domain: `joined` checks) though they read nothing in common: in a transformer's
        backward a LayerNorm's weight and bias sums and the next bias gradient's sum over
        the LayerNorm's input gradient, two launches (and two second stages) a LayerNorm
        instead of four. At most MAX_ALONGSIDE anchors, so that independent sums of one
        shape (a gradient clip's norms) do not pile their accumulators into one kernel."""
        stage = node.meta.get(SPLIT_STAGE)
        return (stage == "stage1" and len(group.anchors) < MAX_ALONGSIDE
                and all(a.meta.get(SPLIT_STAGE) == stage for a in group.anchors))

    def space(self, kernel: dict[str, Any]) -> list[Point]:
        sizes = kernel.get("sizes", {})
        stages = int(kernel.get("config", {}).get("num_stages", 1))
        xs = clip(XBLOCKS, next_pow2(sizes.get("xnumel", 1)))
        r_full = next_pow2(sizes.get("rnumel", 1))
        points: list[Point] = []
        for name, variant in VARIANTS.items():
            if variant.opt_in and kernel.get("variant") != name:
                continue
            rs = [r_full] if variant.whole_rows else clip(LOOPED_RBLOCKS, r_full)
            for x, r, w in itertools.product(xs, rs, WARPS):
                points.append((name, {"XBLOCK": x, "RBLOCK": r, "num_warps": w, "num_stages": stages}))
        return points

    def prune(self, variant: str, config: Config, sizes: dict[str, int], dtype: str,
              limits: BlockLimits) -> str | None:
        rblock = int(config.get("RBLOCK", 1))
        elements = int(config.get("XBLOCK", 1)) * rblock
        reason = prune_block(elements, int(config.get("num_warps", 4)), limits)
        if reason is None and VARIANTS[variant].whole_rows and rblock < sizes.get("rnumel", 1):
            reason = f"{variant} RBLOCK {rblock} is below rnumel {sizes.get('rnumel')}"
        return reason

    def sweep(self, sizes: dict[str, int]) -> list[Point]:
        rb = next_pow2(sizes["rnumel"])
        out: list[Point] = []
        for name, variant in VARIANTS.items():
            if variant.whole_rows and rb <= 8192:
                out += [(name, {"XBLOCK": x, "RBLOCK": rb, "num_warps": w, "num_stages": 1})
                        for x, w in ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16))
                        if x * rb <= 16384]
            elif not variant.whole_rows:
                out += [(name, {"XBLOCK": 1, "RBLOCK": b, "num_warps": w, "num_stages": 1})
                        for b, w in ((1024, 4), (2048, 8), (4096, 16)) if b < rb]
        return out

    def generate(self, group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                 comment: list[str], int64: bool) -> Generated:
        frame = RowFrame(group, writer(set(group.members), is_buffer, int64), is_buffer)
        VARIANTS[variant].body(frame)
        return frame.finish(comment)

    # ---- fusion: rows of one domain, every reduction's value read at its row ----

    def start(self, node: fx.Node, name: str, position: int) -> KernelGroup:
        info = reduction_info(node)
        return KernelGroup(name, self.group_kind, info.domain, [node], position, anchors=[node],
                           dtype=meta(info.source).dtype)

    def joined(self, group: KernelGroup, node: fx.Node, reads: Reads) -> tuple[str, Domain] | None:
        """A reduction joins one of its domain, or makes a value kernel over its input's
        shape a reduction when it reduces the inner dims (a column reduction has few
        programs: full-size work in it would lack parallelism); a value joins as a row
        of the domain, or as large as an inner domain."""
        dom = group.domain
        if reads.kind.anchor:
            info = reduction_info(node)
            if group.kind == self.group_kind:
                return (self.group_kind, dom) if dom == info.domain else None
            if not group.anchors and dom.shape == info.domain.shape and info.domain.inner:
                return self.group_kind, info.domain
            return None
        rows = row_shapes(dom) if not dom.inner else (dom.shape, *row_shapes(dom))
        return (self.group_kind, dom) if meta(node).shape in rows else None

    def can_fuse(self, group: KernelGroup, node: fx.Node, reads: Reads) -> bool:
        """`node` read where the looped variant computes it (every variant computes each
        member where it does), the other reductions' values at their rows; a new
        reduction needs every other member a row or the whole of the domain."""
        dom = group.domain
        xdims, full, rows = frame_indices(dom)
        anchors = set(group.anchors)

        def natural(anchor: fx.Node) -> Index:
            return reduced_index(reduction_info(anchor), rows)

        if reads.kind.anchor:
            shapes = (dom.shape, *row_shapes(dom))
            if any(meta(n).shape not in shapes for n in group.members if n not in anchors):
                return False
            return reads.at_own_index(group, reduction_info(node).source, full, anchors - {node}, natural)
        idx = full if meta(node).shape == dom.shape else member_row_index(node, {}, xdims, dom)
        return reads.at_own_index(group, node, idx, anchors, natural)


KIND = ReductionKind()
