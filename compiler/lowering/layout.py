"""Channels-last convolutions: a graph of 2-D convolutions runs them on NHWC tensors.

cuDNN's fast half and bfloat16 convolutions work on NHWC; handed NCHW tensors, it
transposes them around each call. So, as Inductor's layout optimization does, each
convolution's input and weight that are not channels-last already get a channels-last
copy (`aten.clone(memory_format=torch.channels_last)`). The convolution's result is then
channels-last, and so is every pointwise value computed from it (ATen's layout rules,
which metadata propagation follows); pointwise kernels iterate over such values in their
memory order (`compiler.ir.storage_order`), so their loads and stores stay coalesced.

A graph output whose layout this changes gets a copy back to its row-major layout, since
the caller (AOTAutograd) expects the strides it traced, unless the caller says it takes
any layout there: a training forward's activations saved for its backward, when the
backward's inputs are restrided to match (`compiler.lowering.training_layout`, applied by
the client to the partitioned pair, so that forward and backward run channels-last end to
end). Under `auto` the pass applies only when the copies back are small next to the
convolutions' inputs: an inference graph that ends in pooling and a linear layer copies
nothing back, and neither does a training forward whose saved activations are free.

`KILN_CHANNELS_LAST`: `auto` (default: the rule above, for graphs whose 2-D convolutions
are ungrouped and not transposed), `on` (whatever the copies back cost), `off`. It changes
a graph's kernels: set it alike on clients and service workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from compiler.ir import MetaError, TensorMeta, dense, dense_strides, same_strides

aten = torch.ops.aten
ENV = "KILN_CHANNELS_LAST"
POLICIES = ("auto", "on", "off")
# Under `auto`: copies back may hold at most this share of the convolutions' input elements.
RESTORE_SHARE = 0.25


def policy() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in POLICIES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(POLICIES)}")
    return value


NHWC = (0, 2, 3, 1)  # channels-last: dims outermost first


def channels_last(m: TensorMeta) -> bool:
    """4-D and dense in N, H, W, C order (size-1 dims' strides do not matter)."""
    return len(m.shape) == 4 and same_strides(m, dense_strides(m.shape, NHWC))


def _convolutions(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and n.target is aten.convolution.default]


def _eligible(conv: fx.Node) -> bool:
    """A 2-D convolution, not transposed, ungrouped (cuDNN's NHWC depthwise and grouped
    kernels are not reliably faster)."""
    x = conv.args[0].meta.get("kiln_meta")
    transposed = conv.args[6] if len(conv.args) > 6 else False
    groups = conv.args[8] if len(conv.args) > 8 else 1
    return isinstance(x, TensorMeta) and len(x.shape) == 4 and not transposed and groups == 1


def _outputs(gm: fx.GraphModule, free: frozenset[int] = frozenset()) -> tuple[fx.Node, list[fx.Node]]:
    """The output node, and the outputs whose layout the caller holds to (those at no index
    of `free`, or also at one outside it)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves = tree_flatten(out.args)[0]
    held = [a for i, a in enumerate(leaves) if isinstance(a, fx.Node) and i not in free]
    return out, held


class _Copies:
    """The copies this pass puts into `gm`, named for kernel names (`fused_clone`), and
    taken out again without a trace."""

    def __init__(self, gm: fx.GraphModule, origins: dict[str, str],
                 original_ops: dict[str, str]) -> None:
        self.gm, self.origins, self.original_ops = gm, origins, original_ops
        self.added: list[fx.Node] = []

    def add(self, value: fx.Node, before: fx.Node, memory_format: torch.memory_format) -> fx.Node:
        with self.gm.graph.inserting_before(before):
            node = self.gm.graph.call_function(aten.clone.default, (value,),
                                               {"memory_format": memory_format})
        self.origins[node.name] = node.name
        self.original_ops[node.name] = "aten.clone.default"
        self.added.append(node)
        return node

    def remove(self, copy: fx.Node) -> None:
        copy.replace_all_uses_with(copy.args[0])
        self.gm.graph.erase_node(copy)
        self.origins.pop(copy.name, None)
        self.original_ops.pop(copy.name, None)
        self.added.remove(copy)

    def remove_all(self) -> None:
        for copy in reversed(list(self.added)):
            self.remove(copy)

    def repairs(self) -> list[fx.Node]:
        return [c for c in self.added if c.kwargs["memory_format"] == torch.contiguous_format]


def channels_last_convolutions(gm: fx.GraphModule, propagate: Callable[[], None],
                               origins: dict[str, str], original_ops: dict[str, str],
                               free_outputs: frozenset[int] = frozenset()) -> bool:
    """Run `gm`'s convolutions channels-last where the policy says so (see the module
    docstring); `propagate` reruns metadata propagation. True when the graph changed.
    `free_outputs` (indices into the flattened outputs) may come out in any dense layout:
    they get no copy back (a training forward's activations saved for its backward, whose
    inputs are restrided to match: `compiler.lowering.training_layout`)."""
    mode = policy()
    convs = _convolutions(gm)
    if mode == "off" or not convs or not all(_eligible(c) for c in convs):
        return False
    out_node, outputs = _outputs(gm, free_outputs)
    conv_elements = sum(c.args[0].meta["kiln_meta"].numel for c in convs)
    if mode == "auto" and _copies_back_bound(convs, outputs) > RESTORE_SHARE * conv_elements:
        return False  # a training forward: decided without rewriting it and back
    before = {o: o.meta.get("kiln_meta") for o in outputs}
    copies = _Copies(gm, origins, original_ops)
    nhwc: dict[fx.Node, fx.Node] = {}  # value -> its channels-last copy
    for conv in convs:
        for value in conv.args[:2]:
            if channels_last(value.meta["kiln_meta"]):
                continue
            if value not in nhwc:
                nhwc[value] = copies.add(value, conv, torch.channels_last)
            conv.replace_input_with(value, nhwc[value])
    if not nhwc:
        return False
    if not _propagate_repairing_views(gm, propagate, copies):
        copies.remove_all()
        propagate()
        return False
    # A value computed from an earlier convolution is channels-last now: its copy is idle.
    idle = [c for c in nhwc.values() if c.args[0].meta.get("kiln_meta") == c.meta.get("kiln_meta")]
    for copy in idle:
        copies.remove(copy)
    if idle:
        propagate()
    changed = [o for o in dict.fromkeys(outputs)
               if isinstance(before[o], TensorMeta) and o.meta.get("kiln_meta") != before[o]]
    copied = sum(o.meta["kiln_meta"].numel for o in changed + copies.repairs())
    if (not all(dense(before[o]) for o in changed)
            or (mode == "auto" and copied > RESTORE_SHARE * conv_elements)):
        copies.remove_all()
        propagate()
        return False
    for o in changed:
        out_node.replace_input_with(o, copies.add(o, out_node, torch.contiguous_format))
    propagate()
    return True


def _copies_back_bound(convs: list[fx.Node], outputs: list[fx.Node]) -> int:
    """Elements of the 4-D outputs computed from a convolution: at most what copies back to
    row-major would move (known before any rewrite and metadata run)."""
    downstream: set[fx.Node] = set()
    todo = list(convs)
    while todo:
        node = todo.pop()
        if node not in downstream:
            downstream.add(node)
            todo.extend(node.users)
    metas = [o.meta.get("kiln_meta") for o in dict.fromkeys(outputs) if o in downstream]
    return sum(m.numel for m in metas if isinstance(m, TensorMeta) and len(m.shape) == 4)


def _propagate_repairing_views(gm: fx.GraphModule, propagate: Callable[[], None],
                               copies: _Copies) -> bool:
    """Propagate metadata; a view that AOTAutograd traced on a row-major value and that
    channels-last strides cannot express (flattening C, H and W) reads a row-major copy
    instead. False when something else fails."""
    views = (aten.view.default, aten._unsafe_view.default)
    for _ in range(len(gm.graph.nodes)):
        try:
            propagate()
            return True
        except MetaError as exc:
            node = exc.node
            if node.target not in views or not isinstance(node.args[0], fx.Node):
                return False
            source = node.args[0]
            node.replace_input_with(source, copies.add(source, node, torch.contiguous_format))
    return False
