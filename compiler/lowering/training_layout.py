"""One layout for a training step: a convnet's forward and backward graphs channels-last
end to end.

Lowering runs a graph's convolutions channels-last (`compiler.lowering.layout`), but a
training forward returns its activations for the backward, and AOTAutograd traced the
backward for the row-major strides it saw: copying them back would cost what the layout
saves, so such a forward kept NCHW and cuDNN converted every convolution's tensors, forward
and backward (resnet18's training step on an H200: 166 conversion kernels per step).

`channels_last_training` rewrites the pair AOTAutograd's partitioner made, before either is
compiled: the forward gets its channels-last copies as explicit nodes (the layout pass,
with the saved activations free to stay channels-last), and each backward input that a
saved activation feeds gets the strides the forward now gives it. Both graphs say what they
compute, so a service building them from the wire format makes the same kernels, and the
graphs run as they are when kiln falls back to eager. A saved activation that the backward
views (`view` cannot follow every layout) keeps the traced layout.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from compiler.ir import TensorMeta
from compiler.lowering.layout import channels_last_convolutions, policy
from compiler.lowering.lower import propagate_meta

log = logging.getLogger(__name__)
aten = torch.ops.aten
# Backward ops on a saved activation that need the layout it was traced with.
_LAYOUT_BOUND = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                 aten.as_strided.default)


def channels_last_training(forward: fx.GraphModule, backward: fx.GraphModule,
                           num_user_outputs: int) -> bool:
    """Rewrite `forward` and `backward` in place (see the module docstring); the forward's
    first `num_user_outputs` outputs keep their layout. True when they changed; on False
    both are as they were."""
    if policy() == "off":
        return False
    vals = [n.meta.get("val") for n in forward.graph.find_nodes(op="placeholder")]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False  # symbolic sizes or opaque inputs: left as traced
    out_node = next(n for n in reversed(forward.graph.nodes) if n.op == "output")
    leaves = tree_flatten(out_node.args)[0]
    saved_into = {p.name: p for p in backward.graph.find_nodes(op="placeholder")}
    user = set(leaves[:num_user_outputs])
    free = frozenset(
        i for i, leaf in enumerate(leaves)
        if i >= num_user_outputs and isinstance(leaf, fx.Node) and leaf not in user
        and leaf.name in saved_into
        and not any(u.target in _LAYOUT_BOUND for u in saved_into[leaf.name].users))
    metas = [TensorMeta.of(v) for v in vals]
    before = {n: n.meta.get("val") for n in forward.graph.nodes}
    propagate_meta(forward, metas)
    changed = channels_last_convolutions(forward, lambda: propagate_meta(forward, metas),
                                         {}, {}, free)
    if changed:
        fake_mode = torch._guards.detect_fake_mode(vals)
        device = next((v.device for v in vals if v.device.type != "cpu"), vals[0].device)
        for node in forward.graph.nodes:
            if node not in before:  # a copy the pass put in
                node.meta["val"] = fake_value(node.meta["kiln_meta"], fake_mode, device)
        placeholders = {i: saved_into[leaves[i].name] for i in free}
        leaves = _save_copies(forward, out_node, leaves, free, before)
        for i in sorted(free):
            placeholder = placeholders[i]
            meta = leaves[i].meta["kiln_meta"]
            if tuple(placeholder.meta["val"].stride()) != tuple(meta.stride):
                placeholder.meta["val"] = fake_value(meta, fake_mode, device)
        forward.recompile()
        backward.recompile()
    for node in forward.graph.nodes:
        node.meta.pop("kiln_meta", None)
    return changed


def _save_copies(forward: fx.GraphModule, out_node: fx.Node, leaves: list[Any],
                 free: frozenset[int], before: dict[fx.Node, Any]) -> list[Any]:
    """The forward's outputs with each free one that is a graph input (a weight, the
    images) replaced by the channels-last copy the forward now makes of it: the backward's
    convolutions then read that copy instead of converting the input again, on every step
    (resnet18's weights, 20 copies per step on an H200, and the stem's images)."""
    copies = {n.args[0]: n for n in forward.graph.nodes
              if n not in before and n.target is aten.clone.default
              and isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder"}
    saved = [copies.get(leaf, leaf) if i in free else leaf for i, leaf in enumerate(leaves)]
    if saved != leaves:
        _, spec = tree_flatten(out_node.args)
        out_node.args = tree_unflatten(saved, spec)
    return saved


def fake_value(meta: TensorMeta, fake_mode: Any, device: torch.device) -> torch.Tensor:
    """A tensor of `meta`'s dtype, shape and strides on `device`, in the graphs' fake mode
    (real, uninitialised, where there is none: graphs traced on real tensors)."""
    if fake_mode is None:
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=device)
    with fake_mode:
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=device)
