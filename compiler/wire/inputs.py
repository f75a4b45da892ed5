"""Seeded random inputs for a wire graph, with index inputs drawn inside their valid range."""

from __future__ import annotations

import math
from typing import Any

import torch

from compiler.wire import input_stats
from compiler.wire.decode import NodeSpec, TensorMeta
from compiler.wire.graph import Graph, from_wire
from compiler.wire.schema import Ref, storage_extent

# Ops that only re-shape, copy or re-type a tensor: an index that flows through them is
# still an index into the same range.
_PASS_THROUGH = frozenset(
    f"aten.{name}"
    for name in (
        "view.default", "_unsafe_view.default", "reshape.default", "clone.default",
        "alias.default", "flatten.using_ints", "squeeze.dim", "squeeze.dims",
        "squeeze.default", "unsqueeze.default", "expand.default", "permute.default",
        "t.default", "transpose.int", "slice.Tensor", "select.int", "_to_copy.default",
        "contiguous.default", "detach.default", "lift_fresh_copy.default",
    )
) | {"prims.convert_element_type.default"}

# Integers that feed no index op: small non-negative values.
_DEFAULT_INT_HIGH = 16


def _dim_size(shape: tuple[int, ...], dim: Any) -> int | None:
    if type(dim) is not int or not -len(shape) <= dim < max(len(shape), 1):
        return None
    return shape[dim] if shape else 1


def _index_bounds(node: NodeSpec, shape_of: Any) -> list[tuple[Any, int]]:
    """(argument, exclusive upper bound) for each index argument of `node`."""
    op, a = node.op, list(node.args)
    kw = node.kwargs

    def arg(i: int, name: str) -> Any:
        return a[i] if len(a) > i else kw.get(name)

    self_shape = shape_of(a[0]) if a and isinstance(a[0], Ref) else None
    bounds: list[tuple[Any, int | None]] = []
    if op == "aten.embedding.default":
        bounds.append((arg(1, "indices"), shape_of(a[0])[0] if shape_of(a[0]) else None))
    elif op == "aten.embedding_dense_backward.default":
        bounds.append((arg(1, "indices"), arg(2, "num_weights")))
    elif op in ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default", "aten._unsafe_index.Tensor"):
        indices = arg(1, "indices") or []
        for k, index in enumerate(indices if isinstance(indices, list) else []):
            bounds.append((index, self_shape[k] if self_shape and k < len(self_shape) else None))
    elif op.startswith(("aten.gather.", "aten.index_select.", "aten.scatter", "aten.index_add.", "aten.index_copy.", "aten.index_fill.")):
        bounds.append((arg(2, "index"), _dim_size(self_shape, arg(1, "dim")) if self_shape else None))
    elif op in ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default"):
        bounds.append((arg(1, "target"), self_shape[-1 if len(self_shape) == 1 else 1] if self_shape else None))
    elif op in ("aten.nll_loss_backward.default", "aten.nll_loss2d_backward.default"):
        inp = shape_of(a[1]) if len(a) > 1 and isinstance(a[1], Ref) else None
        bounds.append((arg(2, "target"), inp[-1 if len(inp) == 1 else 1] if inp else None))
    return [(ref, high) for ref, high in bounds if isinstance(ref, Ref) and isinstance(high, int) and high > 0]


def _shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """The shape of every input, constant and single-tensor node, by name."""
    shapes = {i.name: i.shape for i in graph.inputs}
    shapes.update({c.name: c.shape for c in graph.constants})
    shapes.update({n.name: n.meta.shape for n in graph.nodes if isinstance(n.meta, TensorMeta)})
    return shapes


def index_ranges(graph: Graph) -> dict[str, int]:
    """For each integer input that feeds an index op (possibly through views), the
    exclusive upper bound of valid values (the smallest over its uses)."""
    shapes = _shapes(graph)
    origin = {i.name: i.name for i in graph.inputs if not i.dtype.is_floating_point}

    def shape_of(ref: Ref) -> tuple[int, ...] | None:
        return shapes.get(ref.name)

    ranges: dict[str, int] = {}
    for node in graph.nodes:
        if node.op in _PASS_THROUGH and node.args and isinstance(node.args[0], Ref) and node.args[0].name in origin:
            origin[node.name] = origin[node.args[0].name]
            continue
        if node.op == "aten.where.self":  # where(mask, index, fill): still an index
            picked = [a.name for a in node.args[1:3] if isinstance(a, Ref) and a.name in origin]
            if picked:
                origin[node.name] = origin[picked[0]]
        for ref, high in _index_bounds(node, shape_of):
            source = origin.get(ref.name)
            if source is not None:
                ranges[source] = min(high, ranges.get(source, high))
    return ranges


# Ops whose input must be positive for a finite result (BatchNorm's running variance
# reaches them through `add(var, eps)`).
_NEEDS_POSITIVE = frozenset({
    "aten.sqrt.default", "aten.rsqrt.default", "aten.log.default", "aten.log2.default",
    "aten.log10.default", "aten.reciprocal.default",
})
_KEEPS_SIGN = frozenset({"aten.add.Tensor", "aten.add.Scalar"})


def positive_inputs(graph: Graph) -> set[str]:
    """Floating inputs that reach sqrt, rsqrt, log or reciprocal through views or an added
    constant: drawn positive, so that reference outputs are finite."""
    origin = {i.name: i.name for i in graph.inputs if i.dtype.is_floating_point}
    positive: set[str] = set()
    for node in graph.nodes:
        first = node.args[0] if node.args and isinstance(node.args[0], Ref) else None
        if first is None or first.name not in origin:
            continue
        others_scalar = all(not isinstance(a, Ref) for a in node.args[1:])
        if node.op in _PASS_THROUGH or (node.op in _KEEPS_SIGN and others_scalar):
            origin[node.name] = origin[first.name]
        elif node.op in _NEEDS_POSITIVE:
            positive.add(origin[first.name])
    return positive


# Contractions: (op, argument position of the operand drawn as a weight).
_CONTRACTIONS = {
    "aten.mm.default": 1, "aten.bmm.default": 1, "aten.addmm.default": 2,
    "aten.baddbmm.default": 2, "aten.convolution.default": 1,
    "aten.convolution_backward.default": 2,
}


def weight_scales(graph: Graph) -> dict[str, float]:
    """Float inputs that are the second operand of a matmul or a convolution's weight:
    the standard deviation to draw them with, 1/sqrt(fan in) (PyTorch's default inits are
    of that size). Drawn standard normal, each of a deep network's layers multiplies
    activations and gradients by about sqrt(fan in): a 6-layer GPT-2's bf16 backward
    overflowed on such inputs, eager included, and verification compared infinities."""
    shapes = _shapes(graph)
    origin = {i.name: i.name for i in graph.inputs if i.dtype.is_floating_point}
    fan_in: dict[str, int] = {}
    for node in graph.nodes:
        first = node.args[0] if node.args and isinstance(node.args[0], Ref) else None
        if node.op in _PASS_THROUGH and first is not None and first.name in origin:
            origin[node.name] = origin[first.name]
            continue
        pos = _CONTRACTIONS.get(node.op)
        if pos is None or len(node.args) <= pos or not isinstance(node.args[pos], Ref):
            continue
        operand = node.args[pos]
        shape = shapes.get(operand.name, ())
        if node.op.startswith("aten.convolution"):
            fan = math.prod(shape[1:]) if len(shape) > 1 else 0
        else:
            fan = shape[-2] if len(shape) >= 2 else 0
        source = origin.get(operand.name)
        if source is not None and fan > 1:
            fan_in[source] = max(fan, fan_in.get(source, 0))
    return {name: fan ** -0.5 for name, fan in fan_in.items()}


def _pair(value: Any, default: list[int]) -> list[int]:
    value = list(value) if isinstance(value, list) and value else default
    return value * 2 if len(value) == 1 else value


def _pool_windows(graph: Graph) -> dict[str, tuple]:
    """Inputs that are max-pool 2d indices: (input H, W, kernel, stride, padding, dilation).

    A valid index points inside its output position's window; backward kernels of each
    device treat other indices differently, so they are drawn inside the window.
    """
    shapes = {i.name: i.shape for i in graph.inputs}
    shapes.update({n.name: n.meta.shape for n in graph.nodes if isinstance(n.meta, TensorMeta)})
    windows = {}
    for node in graph.nodes:
        a = node.args
        if node.op != "aten.max_pool2d_with_indices_backward.default" or len(a) < 8:
            continue
        if not (isinstance(a[7], Ref) and isinstance(a[1], Ref)) or len(shapes.get(a[1].name, ())) < 2:
            continue
        height, width = shapes[a[1].name][-2:]
        kernel = _pair(a[2], [1])
        windows[a[7].name] = (height, width, kernel, _pair(a[3], kernel), _pair(a[4], [0]), _pair(a[5], [1]))
    return windows


def _draw_pool_indices(shape: tuple[int, ...], window: tuple, gen: torch.Generator) -> torch.Tensor:
    """Flat (h * W + w) indices, each inside its output position's pooling window."""
    height, width, kernel, stride, pad, dil = window
    out_h, out_w = shape[-2:]
    u_h, u_w = torch.rand(shape, generator=gen), torch.rand(shape, generator=gen)
    start_h = (torch.arange(out_h) * stride[0] - pad[0]).view(out_h, 1)
    start_w = (torch.arange(out_w) * stride[1] - pad[1]).view(1, out_w)
    h = _tap(start_h, height, kernel[0], dil[0], u_h)
    w = _tap(start_w, width, kernel[1], dil[1], u_w)
    return (h * width + w).contiguous()


def _tap(start: torch.Tensor, size: int, kernel: int, dil: int, u: torch.Tensor) -> torch.Tensor:
    """A random tap of each window (first input position `start`) that lies inside [0, size)."""
    low = torch.clamp(-start + dil - 1, min=0) // dil
    high = torch.clamp((size - 1 - start) // dil, max=kernel - 1)
    span = (high - low + 1).clamp(min=1)
    tap = torch.minimum(low + (u * span).long(), high).clamp(min=0)
    return (start + tap * dil).clamp(0, size - 1)


def random_inputs(graph: Graph | dict | str | bytes, seed: int = 0, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Seeded random tensors for every graph input, honouring dtype, shape, stride and
    storage offset. Floats are standard normal, or uniform in [0.5, 1.5) where they reach
    sqrt/rsqrt/log/reciprocal (`positive_inputs`), or normal with std 1/sqrt(fan in) where
    they are a matmul's second operand or a convolution's weight (`weight_scales`); saved statistics of backward graphs
    (rstd, invstd, log-probabilities, attention logsumexp: `compiler.wire.input_stats`) are drawn
    or computed in their realistic range; integer inputs that feed index ops (embedding,
    index, gather, scatter, nll_loss targets) are drawn in [0, size of the indexed dim),
    max-pool indices inside their window; other integers in [0, 16); bools uniform. Values
    are drawn on the CPU, so every device gets the same ones. requires_grad is not set.
    """
    if not isinstance(graph, Graph):
        graph = from_wire(graph)
    gen = torch.Generator().manual_seed(seed)
    ranges = index_ranges(graph)
    windows = _pool_windows(graph)
    positive = positive_inputs(graph)
    scales = weight_scales(graph)
    stats = input_stats.find(graph, _PASS_THROUGH)
    flats, views = [], {}
    for inp in graph.inputs:
        numel = math.prod(inp.shape)
        extent = storage_extent(inp.shape, inp.stride, inp.storage_offset)
        if inp.dtype == torch.bool:
            flat = torch.randint(0, 2, (extent,), generator=gen).bool()
        elif inp.name in positive:
            flat = (torch.rand(extent, generator=gen) + 0.5).to(inp.dtype)
        elif inp.name in stats.factors:
            flat = input_stats.draw_factor(extent, gen).to(inp.dtype)
        elif inp.name in stats.log_probs and numel:
            flat = torch.zeros(extent, dtype=inp.dtype)
            flat.as_strided(inp.shape, inp.stride, inp.storage_offset).copy_(
                input_stats.draw_log_probs(inp.shape, gen))
        elif inp.dtype.is_floating_point or inp.dtype.is_complex:
            draw_dtype = inp.dtype if inp.dtype.itemsize >= 2 and not str(inp.dtype).startswith("torch.float8") else torch.float32
            flat = torch.randn(extent, generator=gen, dtype=draw_dtype)
            if inp.name in scales:
                flat = flat * scales[inp.name]
            flat = flat.to(inp.dtype)
        elif inp.name in windows and len(inp.shape) >= 2 and numel:
            dense = _draw_pool_indices(inp.shape, windows[inp.name], gen).to(inp.dtype)
            flat = torch.zeros(extent, dtype=inp.dtype)
            flat.as_strided(inp.shape, inp.stride, inp.storage_offset).copy_(dense)
        else:
            high = min(ranges.get(inp.name, _DEFAULT_INT_HIGH), torch.iinfo(inp.dtype).max + 1)
            flat = torch.randint(0, high, (extent,), generator=gen, dtype=torch.int64).to(inp.dtype)
        flats.append(flat)
        views[inp.name] = flat.as_strided(inp.shape, inp.stride, inp.storage_offset)
    input_stats.fill(stats, views, gen)
    return [flat.to(device).as_strided(inp.shape, inp.stride, inp.storage_offset)
            for flat, inp in zip(flats, graph.inputs, strict=True)]
