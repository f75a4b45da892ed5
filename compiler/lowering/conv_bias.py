"""A convolution's bias as a pointwise add that fuses into the kernel reading the result.

cuDNN has no bias in its convolution: ATen runs `cudnn_convolution` and then `add_` of the
bias as a kernel of its own, one more read and write of the whole result (timm's
ConvNeXt-T, batch 32 on an H200: 22 such kernels a step, 0.23 ms). Inductor lowers a
biased convolution the same way this pass does: the convolution without its bias, then
`result + bias.view(C, 1, ...)`, a pointwise op that joins whatever kernel reads the
result next (ConvNeXt's LayerNorm, a residual add). The numbers are ATen's on the GPU: the
result rounded to its dtype, then the bias added and rounded again, as `add_` does.
"""

from __future__ import annotations

import torch
from torch import fx

aten = torch.ops.aten


def unfuse_convolution_bias(gm: fx.GraphModule, origins: dict[str, str]) -> bool:
    """Rewrite every `aten.convolution` with a bias into the convolution without it plus an
    add of the bias viewed to broadcast over the channel dim (the new nodes' origin is the
    convolution's, so kernel names say `convolution`). Returns whether any changed; the new
    nodes have no metadata yet (the caller propagates it)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        args = list(node.args)
        bias = args[2] if len(args) > 2 else None
        if not isinstance(bias, fx.Node):
            continue
        rank = len(node.meta["kiln_meta"].shape)
        args[2] = None
        with gm.graph.inserting_after(node):
            conv = gm.graph.call_function(aten.convolution.default, tuple(args), dict(node.kwargs))
        with gm.graph.inserting_after(conv):
            shape = [-1] + [1] * (rank - 2)
            view = gm.graph.call_function(aten.view.default, (bias, shape))
        with gm.graph.inserting_after(view):
            added = gm.graph.call_function(aten.add.Tensor, (conv, view))
        node.replace_all_uses_with(added)
        for new in (conv, view, added):
            origins[new.name] = origins.get(node.name, node.name)
        gm.graph.erase_node(node)
        changed = True
    return changed
