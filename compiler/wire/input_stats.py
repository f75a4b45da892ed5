"""Saved statistics among a backward graph's inputs, recognised by how the graph uses them.

A training backward graph receives what its forward saved: layer-norm `rstd`, batch-norm
`invstd`, log-softmax outputs, attention `logsumexp`. Drawn standard normal they make the
backward ill-conditioned (a negative or tiny rstd, exp(log-prob) far above 1, attention
weights exp(S - lse) in the hundreds), so `compiler.random_inputs` draws them realistically:

- factors: float inputs smaller than the graph's largest float input that are only ever
  multiplied (mul, or the numerator of div), like rstd, invstd and norm weights: uniform
  in [0.5, 2];
- log-probabilities: inputs only fed to exp: a log-softmax over the last dim (<= 0, each
  row's exp sums to 1);
- attention statistics: the `out` and `logsumexp` arguments of an SDPA backward op whose
  query, key and value are graph inputs (or aliases of them): computed from them (causal
  flag, scale and an additive or boolean attention mask that is an input honoured: cuDNN
  and efficient attention take the mask, and a logsumexp that ignores it made cuDNN's
  backward of GPT-2 return NaN); a `logsumexp` whose q/k are not inputs: log(keys) +
  uniform [0, 1];
- log-sum-exp subtrahends: inputs only used as `b` in exp(a - b): logsumexp of `a` over
  the dims where `b` has size 1 when `a` is an input, else log(that count) + uniform [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from compiler.wire.decode import TensorMeta
from compiler.wire.graph import Graph
from compiler.wire.schema import Ref

# (query, key, value, out, logsumexp, is_causal, scale, mask) argument positions per op
# (mask: the additive attention bias or boolean mask; None where the op takes none; the
# CPU flash op takes it as the keyword `attn_mask`, position 8).
_ATTENTION_BACKWARD = {
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (1, 2, 3, 4, 5, 7, 9, 8),
    "aten._scaled_dot_product_flash_attention_backward.default": (1, 2, 3, 4, 5, 11, 14, None),
    "aten._scaled_dot_product_efficient_attention_backward.default": (1, 2, 3, 5, 6, 11, 12, 4),
    "aten._scaled_dot_product_cudnn_attention_backward.default": (1, 2, 3, 4, 5, 14, 15, 8),
}
_FACTOR_USES = frozenset({("aten.mul.Tensor", 0), ("aten.mul.Tensor", 1), ("aten.div.Tensor", 0)})


@dataclass(frozen=True)
class Attention:
    """One SDPA backward op's inputs: names of q, k, v, out, logsumexp (None where the
    argument is not a graph input), causal flag and scale."""

    query: str | None
    key: str | None
    value: str | None
    out: str | None
    logsumexp: str | None
    causal: bool
    scale: float | None
    mask: str | None = None  # an attention bias (or boolean mask) that is a graph input


@dataclass
class Statistics:
    """What `find` recognised among a graph's float inputs."""

    factors: set[str]
    log_probs: set[str]
    attention: list[Attention]
    subtrahends: dict[str, tuple[str | None, tuple[int, ...]]]  # b -> (a if an input, a's shape)

    def drawn_later(self) -> set[str]:
        """Inputs whose values `fill` computes from other inputs (or a range)."""
        names = {a.logsumexp for a in self.attention} | set(self.subtrahends)
        names |= {a.out for a in self.attention if None not in (a.query, a.key, a.value)}
        return {n for n in names if n is not None}


def _uses(graph: Graph, pass_through: frozenset[str]) -> tuple[dict[str, str], dict[str, list]]:
    """(node name -> the float input it views, input -> [(node, argument position)])."""
    origin = {i.name: i.name for i in graph.inputs if i.dtype.is_floating_point}
    uses: dict[str, list] = {name: [] for name in origin}
    for node in graph.nodes:
        first = node.args[0] if node.args and isinstance(node.args[0], Ref) else None
        if node.op in pass_through and first is not None and first.name in origin:
            origin[node.name] = origin[first.name]
            continue
        for pos, arg in enumerate(node.args):
            for ref in arg if isinstance(arg, list) else [arg]:
                if isinstance(ref, Ref) and ref.name in origin:
                    uses[origin[ref.name]].append((node, pos))
        for value in node.kwargs.values():
            if isinstance(value, Ref) and value.name in origin:
                uses[origin[value.name]].append((node, -1))
    return origin, uses


def find(graph: Graph, pass_through: frozenset[str]) -> Statistics:
    """Recognise the saved statistics among `graph`'s float inputs (see the module doc)."""
    origin, uses = _uses(graph, pass_through)
    numel = {i.name: math.prod(i.shape) for i in graph.inputs if i.dtype.is_floating_point}
    largest = max(numel.values(), default=0)
    shapes = {i.name: i.shape for i in graph.inputs}
    shapes.update({n.name: n.meta.shape for n in graph.nodes if isinstance(n.meta, TensorMeta)})
    consumers: dict[str, list] = {}
    for node in graph.nodes:
        for arg in node.args:
            if isinstance(arg, Ref):
                consumers.setdefault(arg.name, []).append(node)
    stats = Statistics(set(), set(), [], {})
    for name, found in uses.items():
        kinds = {(n.op, pos) for n, pos in found}
        if found and kinds <= _FACTOR_USES and numel[name] < largest:
            stats.factors.add(name)
        elif found and {op for op, _ in kinds} == {"aten.exp.default"}:
            stats.log_probs.add(name)
        elif found and all(_is_exp_subtrahend(n, pos, consumers) for n, pos in found):
            a = found[0][0].args[0]
            stats.subtrahends[name] = (_input(a, origin, shapes), tuple(shapes.get(a.name, ())))
    for node in graph.nodes:
        spec = _ATTENTION_BACKWARD.get(node.op)
        if spec is None or len(node.args) <= spec[4]:
            continue
        names = [_input(node.args[i] if i < len(node.args) else None, origin, shapes)
                 for i in spec[:5]]
        causal = bool(node.args[spec[5]]) if spec[5] < len(node.args) else False
        scale = node.args[spec[6]] if spec[6] < len(node.args) else node.kwargs.get("scale")
        mask_arg = None if spec[7] is None else (
            node.args[spec[7]] if spec[7] < len(node.args) else node.kwargs.get("attn_mask"))
        mask = _input(mask_arg, origin, shapes) if isinstance(mask_arg, Ref) else None
        stats.attention.append(Attention(*names, causal=causal, scale=scale, mask=mask))
    stats.factors -= stats.drawn_later()
    stats.log_probs -= stats.drawn_later()
    return stats


def _input(arg: Any, origin: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> str | None:
    """The input `arg` is, or aliases with its own shape (not a transposed or sliced view)."""
    if not isinstance(arg, Ref) or arg.name not in origin:
        return None
    source = origin[arg.name]
    return source if shapes.get(source) == shapes.get(arg.name) else None


def _is_exp_subtrahend(node: Any, pos: int, consumers: dict[str, list]) -> bool:
    if node.op != "aten.sub.Tensor" or pos != 1 or not isinstance(node.args[0], Ref):
        return False
    users = consumers.get(node.name, [])
    return bool(users) and all(u.op == "aten.exp.default" for u in users)


def draw_factor(extent: int, gen: torch.Generator) -> torch.Tensor:
    """Uniform in [0.5, 2]: an rstd, invstd or norm weight."""
    return torch.rand(extent, generator=gen) * 1.5 + 0.5


def draw_log_probs(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A log-softmax over the last dim of a standard normal draw."""
    return torch.log_softmax(torch.randn(shape, generator=gen, dtype=torch.float64), -1)


def fill(stats: Statistics, tensors: dict[str, torch.Tensor], gen: torch.Generator) -> None:
    """Overwrite the computed statistics in `tensors` (by input name), in place."""
    for att in stats.attention:
        if None not in (att.query, att.key, att.value):
            out, lse = _attention(tensors[att.query], tensors[att.key], tensors[att.value],
                                  att.causal, att.scale,
                                  tensors[att.mask] if att.mask is not None else None)
            if att.out is not None and tensors[att.out].shape == out.shape:
                tensors[att.out].copy_(out)
            if att.logsumexp is not None:
                _copy_leading(tensors[att.logsumexp], lse)
        elif att.logsumexp is not None and att.key is not None:
            keys = tensors[att.key].shape[-2]
            _range_fill(tensors[att.logsumexp], math.log(max(keys, 1)), gen)
    for name, (a, a_shape) in stats.subtrahends.items():
        b = tensors[name]
        dims = tuple(d for d in range(-b.dim(), 0) if b.shape[d] == 1 and a_shape
                     and len(a_shape) >= -d and a_shape[d] > 1)
        if a is not None and dims and tuple(tensors[a].shape) == a_shape:
            b.copy_(torch.logsumexp(tensors[a].double(), dims, keepdim=True).expand(b.shape))
        else:
            count = math.prod(a_shape[d] for d in dims) if dims else 1
            _range_fill(b, math.log(max(count, 1)), gen)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               scale: float | None, mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output and logsumexp of the scaled (and masked) scores, in float64."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = q64 @ k64.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask.double()
    if causal:
        length_q, length_k = scores.shape[-2:]
        mask = torch.ones(length_q, length_k, dtype=torch.bool).tril(length_k - length_q)
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.softmax(scores, -1) @ v64, lse


def _copy_leading(dest: torch.Tensor, values: torch.Tensor) -> None:
    """Copy `values` into `dest`: as it is, with cuDNN's trailing unit dim, or into the
    leading part of `dest`'s last dim (efficient attention pads logsumexp to a multiple of
    32; the padding gets the last real value of its row)."""
    if dest.shape == values.shape:
        dest.copy_(values)
        return
    if dest.shape == (*values.shape, 1):  # cuDNN keeps logsumexp as (B, H, S, 1)
        dest.copy_(values.unsqueeze(-1))
        return
    n = min(values.shape[-1], dest.shape[-1])
    if dest.shape[:-1] != values.shape[:-1] or n == 0:
        return
    dest[..., :n].copy_(values[..., :n])
    dest[..., n:].copy_(values[..., n - 1 : n].expand(*values.shape[:-1], dest.shape[-1] - n))


def _range_fill(dest: torch.Tensor, low: float, gen: torch.Generator) -> None:
    dest.copy_(torch.rand(dest.shape, generator=gen, dtype=torch.float64) + low)
