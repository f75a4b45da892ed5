"""Gradients in their inputs' layouts: a training backward returns each input's gradient
with the strides of the input it belongs to.

Autograd hands a parameter's gradient to `AccumulateGrad`, which keeps the tensor as
`.grad` only when its strides are the parameter's (the layout contract); any other layout
is copied, one ATen launch per parameter on every step, outside the CUDA graph. In a
channels-last training step (`compiler.lowering.training_layout`) every convolution's
weight gradient comes out channels-last while the weights are row-major: resnet18's step
on an H200 made 17 such copies, and the GPU idled between them while the host launched
them one by one after the backward's graph had finished.

`gradients_in_input_layouts` rewrites the backward AOTAutograd's partitioner made, before
it is compiled: where the layout the compiler will give a gradient (metadata propagated on
the meta device, as lowering does) differs from its input's, the gradient gets a copy into
the input's layout as the graph's output. Inside the graph the copy joins the kernel that
computes the gradient where one does, and is one more launch of the CUDA graph where a
library call (cuDNN's weight gradient) computes it. Only inputs whose layout a copy can
state are handled: row-major and channels-last.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._pytree import tree_flatten, tree_unflatten

from compiler.ir import TensorMeta, dense, same_strides
from compiler.lowering.layout import channels_last
from compiler.lowering.lower import propagate_meta
from compiler.lowering.training_layout import fake_value

log = logging.getLogger(__name__)
aten = torch.ops.aten


def _memory_format(value: torch.Tensor) -> torch.memory_format | None:
    """The memory format that states `value`'s layout, or None (overlapping, gapped, or
    dense in another order)."""
    m = TensorMeta.of(value)
    if dense(m):
        return torch.contiguous_format
    if channels_last(m):
        return torch.channels_last
    return None


def gradients_in_input_layouts(forward: fx.GraphModule, backward: fx.GraphModule) -> int:
    """Rewrite `backward` in place so that the gradient of the forward's input i (the
    backward's output i) comes out in that input's layout; how many gradients got a copy.
    Nothing changes where the two graphs do not pair one output per input, or where the
    backward's metadata cannot be propagated."""
    inputs = [n.meta.get("val") for n in forward.graph.find_nodes(op="placeholder")]
    placeholders = list(backward.graph.find_nodes(op="placeholder"))
    vals = [p.meta.get("val") for p in placeholders]
    out_node = next(n for n in reversed(backward.graph.nodes) if n.op == "output")
    grads, spec = tree_flatten(out_node.args)
    if len(grads) != len(inputs) or not all(isinstance(v, torch.Tensor) for v in vals):
        return 0  # rng seeds beside the inputs, symbolic sizes or opaque values: as traced
    try:
        # AOTAutograd partitions under its fake mode; the meta run must not see it
        with unset_fake_temporarily():
            propagate_meta(backward, [TensorMeta.of(v) for v in vals])
        targets = _targets(inputs, grads)
    except Exception as exc:  # noqa: BLE001 - a layout left as traced still trains
        log.debug("kiln: gradient layouts left as traced: %s", exc)
        return 0
    finally:
        for node in backward.graph.nodes:
            node.meta.pop("kiln_meta", None)
    for i, memory_format in targets.items():
        grad = grads[i]
        with backward.graph.inserting_before(out_node):
            copy = backward.graph.call_function(aten.clone.default, (grad,),
                                                {"memory_format": memory_format})
        val = grad.meta.get("val")
        if isinstance(val, torch.Tensor):
            copy.meta["val"] = _restrided(val, inputs[i])
        grads[i] = copy
    if targets:
        out_node.args = tree_unflatten(grads, spec)
        backward.recompile()
    return len(targets)


def _targets(inputs: list[Any], grads: list[Any]) -> dict[int, torch.memory_format]:
    """Output index -> the memory format its gradient must be copied into."""
    targets: dict[int, torch.memory_format] = {}
    for i, (value, grad) in enumerate(zip(inputs, grads, strict=True)):
        if not isinstance(value, torch.Tensor) or not isinstance(grad, fx.Node):
            continue
        meta = grad.meta.get("kiln_meta")
        if not isinstance(meta, TensorMeta) or meta.shape != tuple(value.shape):
            continue
        memory_format = _memory_format(value)
        if memory_format is None or same_strides(meta, tuple(value.stride())):
            continue
        targets[i] = memory_format
    return targets


def _restrided(val: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A value of `val`'s kind (fake or real) with `val`'s dtype and `like`'s shape and
    strides: the copy's traced value."""
    meta = TensorMeta(val.dtype, tuple(like.shape), tuple(like.stride()), 0)
    return fake_value(meta, torch._guards.detect_fake_mode([val]), val.device)
