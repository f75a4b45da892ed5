"""Split reductions: a reduction with few outputs and many reduced elements in two stages.

One reduction kernel computes its outputs in parallel and each output's reduction in one
program (a row reduction) or one lane (a column reduction: reduced dims outside the kept
ones). With few outputs that is little parallelism: `(x * w).sum(0)` over [8192, 1024]
ran as 64 programs of 16 columns, each looping over 8192 rows. This pass rewrites such a
reduction, in the aten graph before fusion, into

  stage 1: the same reduction over part of the reduced elements, into partials (float32
           for floating sums and means, float64 for float64; the input dtype for amax/amin);
  stage 2: the reduction of the partials, cast to the output dtype (a mean divides the
           sum by the original count first).

Both stages are ordinary reductions, so fusion treats them like any other: a pointwise
prologue (`(x - mean) * rstd * dy`) is inlined into stage 1's kernel, reductions of the
same domain share a kernel in each stage (LayerNorm's weight and bias gradients,
BatchNorm's two sums), and epilogues join stage 2. Sums are deterministic: fixed chunks,
no atomics.

How the reduced elements are divided, from the source's memory order (its strides, so a
channels-last tensor is read as [N, H, W, C]), where a dense source's adjacent reduced dims
are first viewed as one (a LayerNorm's [8, 512, 768] summed over (0, 1) is split as
[4096, 768] summed over 0, as the next bias gradient is, so that their first stages have
one domain and share a kernel):
- the source is first viewed in memory order (a permute, when it is not already);
- row regime (the innermost dim is reduced, and the run of innermost reduced dims holds
  at least ROW_RUN elements: NCHW BatchNorm over (0, 2, 3)): stage 1 reduces that run,
  so it is a row reduction over contiguous memory; the reduced dims outside it are the
  partials' dims (NCHW: [N, C] partials), and only when those are still too few is the
  run's outermost dim split further;
- otherwise (column regime: the innermost dim is kept, as in [rows, C] summed over rows,
  or channels-last BatchNorm): the reduced dims, outermost first, become partial dims
  while the partials are fewer than wanted, and the next one is split into S chunks
  (a divisor of its size near the wanted factor, else padded with the reduction's
  identity to a multiple of S). Stage 1 then reads [S, rows / S, C] with C contiguous.

Size rule (`SplitPolicy`; the kernels depend on the graph alone, so the rule uses no
device facts; the reference is an H200's 132 SMs):
- a column reduction (a reduced dim before a kept one) over fewer than `min_rnumel`
  elements per output stays one kernel, and so does a row reduction (reduced dims
  trailing) over fewer than `min_rnumel_rows`: its program reads 4096 elements a step,
  a column reduction's 64 per column, so a row needs far more elements before the
  second kernel's launch pays (a 2 x 5000 softmax stays one kernel);
- so does one whose single kernel already has enough parallelism: a row reduction
  with at least `row_target` outputs, a column reduction with at least `column_target`
  outputs (columns are lanes: 16 to 64 to a program);
- otherwise stage 1 should produce about `row_target` (row regime) or `column_target`
  (column regime) partial outputs, each reducing at least `min_chunk` elements, with at
  most `max_partials` partials per output (stage 2 stays one short pass).

Two identical reductions that the rule splits (var_mean's decomposition computes its mean
twice) are split once: unsplit they shared a kernel, split their stage 2s would not.

`KILN_SPLIT_REDUCTIONS`: `auto` (default: the rule above), `off`, or an integer N: split
every sum/mean/amax/amin over at least two elements, whatever its size, into about N
partials per output (the row regime still keeps its outer reduced dims whole); tests use
it to force a split. It is read when a graph is lowered (lowerings are cached per graph
in a process). Lowering must be the same where a schedule is made and where it is built
(the service's CPU worker and the clients): set it alike on both, or use it for local
experiments only (`KILN_URL=off`). The split factor is not a schedule choice: kernels
and their buffers come from the graph alone (a schedule picks variants and block sizes),
so tuning it would need a lowering option carried by the schedule.

Not split: argmax/argmin (partials would need their indices), prod, any/all, and
reductions of dtypes Triton does not have.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import fx

from compiler.codegen.common import TL_DTYPES, Unsupported
from compiler.codegen.reduction import identity, reduction_info
from compiler.ir import (
    SPLIT_STAGE,
    Domain,
    TensorMeta,
    contiguous_strides,
    dense_strides,
    memory_order,
    same_strides,
)

aten = torch.ops.aten

SPLIT_OPS = ("sum", "mean", "max", "min")  # reduction_info's op names: amax -> max
ROW_RUN = 16  # innermost reduced run (elements) that makes stage 1 a row reduction
ENV = "KILN_SPLIT_REDUCTIONS"


@dataclass(frozen=True)
class SplitPolicy:
    """When to split a reduction and into how many partials (module docstring)."""

    min_rnumel: int = 1024
    min_rnumel_rows: int = 32768
    row_target: int = 1024
    # Column programs loop over their chunk one tile at a time: on an H200, HF GPT-2's bias
    # gradient (4096 x 3072 bf16 summed over rows) in 8 chunks of 512 rows took 16 us,
    # 2.5x Inductor's; chunks of ~128 rows (two 64-row steps) give 4x the programs.
    column_target: int = 131072
    min_chunk: int = 128
    max_partials: int = 256
    force: int | None = None  # partials per output for every splittable reduction
    enabled: bool = True


def policy_from_env() -> SplitPolicy:
    """The policy `KILN_SPLIT_REDUCTIONS` asks for (`auto`, `off` or a partial count)."""
    raw = os.environ.get(ENV, "auto").strip().lower()
    if raw in ("", "auto", "on", "1"):
        return SplitPolicy()
    if raw in ("off", "0", "no", "false"):
        return SplitPolicy(enabled=False)
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be auto, off or a partial count, got {raw!r}") from None
    if n < 2:
        raise ValueError(f"{ENV}: a forced split needs at least 2 partials, got {n}")
    return SplitPolicy(force=n)


@dataclass(frozen=True)
class Split:
    """How one reduction is split: dims in memory order, and what stage 1 keeps.

    `order`: the source's dims, outermost first; `outer`: reduced dims that are partial
    dims whole; `split`: (dim, S, chunk) of the reduced dim cut into S chunks of `chunk`
    (S * chunk may exceed its size: the rest is padding), or None.
    """

    order: tuple[int, ...]
    outer: tuple[int, ...]
    split: tuple[int, int, int] | None


def _factor(n: int, ideal: int) -> int:
    """A divisor of n near `ideal` (within a factor of 2, nearest in ratio), else `ideal`
    (the dim is then padded to a multiple of it)."""
    ideal = max(2, min(ideal, n))
    best = None
    for s in range(max(2, (ideal + 1) // 2), min(n, 2 * ideal) + 1):
        if n % s == 0:
            score = max(s / ideal, ideal / s)
            if best is None or score < best[0]:
                best = (score, s)
    return best[1] if best else ideal


def plan_split(m: TensorMeta, dims: tuple[int, ...], policy: SplitPolicy) -> Split | None:
    """The split of a reduction of a source with meta `m` over `dims` (sorted, as
    `reduction_info` gives them), or None to keep it one kernel."""
    shape = m.shape
    rdims = set(dims)
    domain = Domain(shape, dims)  # the one kernel it would otherwise be
    xnumel, rnumel = domain.xnumel, domain.rnumel
    if not policy.enabled or rnumel < 2 or xnumel == 0:
        return None
    order = memory_order(m)
    reduced = [d for d in order if d in rdims and shape[d] > 1]
    big = [d for d in order if shape[d] > 1]
    run = []  # innermost run of reduced dims
    for d in reversed(big):
        if d not in rdims:
            break
        run.insert(0, d)
    row_regime = math.prod(shape[d] for d in run) >= ROW_RUN
    if policy.force is not None:
        want = min(policy.force, rnumel)
    else:
        if rnumel < (policy.min_rnumel_rows if domain.inner else policy.min_rnumel):
            return None
        enough = policy.row_target if domain.inner else policy.column_target
        if xnumel >= enough:
            return None
        target = policy.row_target if row_regime else policy.column_target
        want = min(-(-target // xnumel), rnumel // policy.min_chunk, policy.max_partials)
        if want < 2:
            return None
    outer: list[int] = []
    p = 1
    if row_regime:
        # stage 1 reduces the contiguous run; every reduced dim outside it is a partial dim
        outer = [d for d in reduced if d not in run]
        p = math.prod(shape[d] for d in outer)
        walk = list(run)
    else:
        walk = list(reduced)
    split = None
    for i, d in enumerate(walk):
        if p >= want:
            break
        n = shape[d]
        last = i == len(walk) - 1
        if not last and p * n <= 2 * want:
            outer.append(d)
            p *= n
            continue
        s = _factor(n, -(-want // p))
        if last:
            s = min(s, max(2, -(-n // 2)))
        split = (d, s, -(-n // s))
        p *= s
        break
    if split is None and not outer:
        return None
    return Split(order, tuple(outer), split)


def _partial_dtype(op: str, out: torch.dtype, src: torch.dtype) -> torch.dtype:
    if op in ("max", "min"):
        return src
    if out.is_floating_point:
        return torch.float64 if out == torch.float64 else torch.float32
    return out


def split_reductions(gm: fx.GraphModule, origins: dict[str, str],
                     policy: SplitPolicy | None = None) -> int:
    """Rewrite each reduction the policy splits into its two stages; returns how many.
    Nodes need `kiln_meta` (the caller propagates metadata again afterwards)."""
    policy = policy_from_env() if policy is None else policy
    if not policy.enabled:
        return 0
    count = 0
    seen: dict[tuple, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        try:
            info = reduction_info(node)
        except (Unsupported, ValueError):
            continue
        out, src = node.meta.get("kiln_meta"), info.source.meta.get("kiln_meta")
        if info.op not in SPLIT_OPS or not isinstance(out, TensorMeta) or not isinstance(src, TensorMeta):
            continue
        if src.dtype not in TL_DTYPES or out.dtype not in TL_DTYPES or src.dtype == torch.bool:
            continue
        if info.op == "mean" and not out.dtype.is_floating_point:
            continue
        plan = plan_split(src, info.dims, policy)
        if plan is None:
            continue
        # One of two identical reductions (var_mean's decomposition computes its mean twice):
        # split once. Unsplit, the two shared a kernel; split, their stage 2s would not.
        key = (node.target, _hashable(node.args), _hashable(node.kwargs))
        if key in seen:
            node.replace_all_uses_with(seen[key])
            gm.graph.erase_node(node)
            continue
        with gm.graph.inserting_before(node):
            before = set(gm.graph.nodes)
            final = _split(gm.graph, node, info.op, info.dims, info.keepdim, src, out, plan,
                           policy)
        for new in gm.graph.nodes:
            if new not in before:
                origins[new.name] = origins.get(node.name, node.name)
        node.replace_all_uses_with(final)
        gm.graph.erase_node(node)
        seen[key] = final
        count += 1
    return count


def _split(graph: fx.Graph, node: fx.Node, op: str, dims: tuple[int, ...], keepdim: bool,
           src: TensorMeta, out: TensorMeta, plan: Split, policy: SplitPolicy) -> fx.Node:
    """The two stages that replace `node`, over its source's merged view where adjacent
    reduced dims merge (`_merge_reduced_runs`), else over the source as it is."""
    merged = _merge_reduced_runs(graph, node, op, dims, src, out)
    if merged is None:
        return _rewrite(graph, node, op, dims, keepdim, src, out, plan)
    reduced, result = merged
    m_src, m_out = reduced.args[0].meta["kiln_meta"], reduced.meta["kiln_meta"]
    m_dims = tuple(reduced.args[1])
    m_plan = plan_split(m_src, m_dims, policy)
    if m_plan is None:  # the sizes the rule reads are the same: it cannot refuse now
        raise AssertionError(f"{node.name}: the merged view of a split reduction is not split")
    with graph.inserting_before(reduced):
        split = _rewrite(graph, reduced, op, m_dims, False, m_src, m_out, m_plan)
    reduced.replace_all_uses_with(split)
    graph.erase_node(reduced)
    return split if result is reduced else result


def _merge_reduced_runs(graph: fx.Graph, node: fx.Node, op: str, dims: tuple[int, ...],
                        src: TensorMeta, out: TensorMeta) -> tuple[fx.Node, fx.Node] | None:
    """`node`'s reduction over its source viewed in memory order with each run of adjacent
    reduced dims as one dim: (the new reduction, the value that replaces `node`: the
    reduction, or a view of it in `out`'s shape). A LayerNorm's weight gradient, [8, 512,
    768] summed over (0, 1), becomes [4096, 768] summed over 0, as the next bias gradient
    is: one memory layout gives one split and one domain, so the two first stages can
    share a kernel. None where no run holds two dims, where the source is not dense in
    memory order, or where its kept dims lie in memory in another order than `out`'s."""
    shape, rdims = src.shape, set(dims)
    order = memory_order(src)
    if not same_strides(src, dense_strides(shape, order)):
        return None
    runs: list[list[int]] = []
    for d in (d for d in order if shape[d] > 1):
        if runs and d in rdims and runs[-1][0] in rdims:
            runs[-1].append(d)
        else:
            runs.append([d])
    kept = [r[0] for r in runs if r[0] not in rdims]
    if all(len(r) == 1 for r in runs) or kept != sorted(kept):
        return None
    new_shape = [math.prod(shape[d] for d in r) for r in runs]
    new_dims = [i for i, r in enumerate(runs) if r[0] in rdims]
    x = node.args[0]
    if order != tuple(range(len(shape))):
        x = graph.call_function(aten.permute.default, (x, list(order)))
    x = graph.call_function(aten.view.default, (x, new_shape))
    x.meta["kiln_meta"] = TensorMeta(src.dtype, tuple(new_shape), contiguous_strides(tuple(new_shape)))
    target = {"sum": aten.sum.dim_IntList, "mean": aten.mean.dim,
              "max": aten.amax.default, "min": aten.amin.default}[op]
    kwargs = {"dtype": node.kwargs["dtype"]} if node.kwargs.get("dtype") is not None else {}
    reduced = graph.call_function(target, (x, new_dims, False), kwargs)
    kept_shape = tuple(new_shape[i] for i in range(len(runs)) if i not in new_dims)
    reduced.meta["kiln_meta"] = TensorMeta(out.dtype, kept_shape, contiguous_strides(kept_shape))
    if kept_shape == tuple(out.shape):
        return reduced, reduced
    result = graph.call_function(aten.view.default, (reduced, list(out.shape)))
    result.meta["kiln_meta"] = out
    return reduced, result


def _hashable(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _rewrite(graph: fx.Graph, node: fx.Node, op: str, dims: tuple[int, ...], keepdim: bool,
             src: TensorMeta, out: TensorMeta, plan: Split) -> fx.Node:
    shape, rank = src.shape, len(src.shape)
    order = plan.order
    y = node.args[0]
    if order != tuple(range(rank)):
        y = graph.call_function(aten.permute.default, (y, list(order)))
    pshape = [shape[d] for d in order]  # the permuted source's shape
    # entries of the view stage 1 reads: ("dim", d) or ("outer", d) / ("inner", d) halves
    parts: list[tuple[str, int]] = []
    for d in order:
        if plan.split is not None and plan.split[0] == d:
            parts += [("outer", d), ("inner", d)]
        else:
            parts.append(("dim", d))
    if plan.split is not None:
        d, s, chunk = plan.split
        pos = order.index(d)
        extra = s * chunk - shape[d]
        if extra:
            pad = [0, 0] * (rank - 1 - pos) + [0, extra]
            y = graph.call_function(aten.constant_pad_nd.default, (y, pad, identity(op, src.dtype)))
        vshape = pshape[:pos] + [s, chunk] + pshape[pos + 1:]
        y = graph.call_function(aten.view.default, (y, vshape))
    rdims = set(dims)
    kept_by_stage1 = [i for i, (kind, d) in enumerate(parts)
                      if kind == "outer" or (kind == "dim" and (d not in rdims or d in plan.outer))]
    stage1_dims = [i for i in range(len(parts)) if i not in kept_by_stage1]
    pd = _partial_dtype(op, out.dtype, src.dtype)
    part = graph.call_function(*_reduce(op, y, stage1_dims, pd, src.dtype))
    part.meta[SPLIT_STAGE] = "stage1"
    # the partials: kept_by_stage1's entries in order; stage 2 reads the partial dims
    # first and the kept dims in the original order, so its output is laid out as before
    remaining = [parts[i] for i in kept_by_stage1]
    partial_pos = [i for i, (kind, d) in enumerate(remaining) if kind == "outer" or d in rdims]
    kept_pos = sorted((i for i in range(len(remaining)) if i not in partial_pos),
                      key=lambda i: remaining[i][1])
    perm = partial_pos + kept_pos
    q = part
    if perm != list(range(len(perm))):
        q = graph.call_function(aten.permute.default, (q, perm))
    stage2_dims = list(range(len(partial_pos)))
    final_dtype = out.dtype if op in ("sum", "max", "min") else pd
    result = graph.call_function(*_reduce(op, q, stage2_dims, final_dtype, pd))
    result.meta[SPLIT_STAGE] = "stage2"
    if op == "mean":
        result = graph.call_function(aten.div.Tensor, (result, math.prod(shape[d] for d in dims)))
        if out.dtype != pd:
            result = graph.call_function(aten._to_copy.default, (result,), {"dtype": out.dtype})
    if keepdim:
        result = graph.call_function(aten.view.default, (result, list(out.shape)))
    return result


def _reduce(op: str, x: fx.Node, dims: list[int], dtype: torch.dtype,
            src_dtype: torch.dtype) -> tuple[object, tuple, dict]:
    """(target, args, kwargs) of a reduction of `x` over `dims` into `dtype`."""
    if op in ("sum", "mean"):
        kwargs = {"dtype": dtype} if dtype != src_dtype else {}
        return aten.sum.dim_IntList, (x, dims, False), kwargs
    return (aten.amax.default if op == "max" else aten.amin.default), (x, dims, False), {}
