"""Record the aten ops a function runs on meta tensors as an FX graph, thread-safely.

`make_fx` would do, but its tracer patches `torch.nn.Module.__call__` and sets a global
"FX is tracing" flag for as long as it runs; a build on a background thread (the client's
poller, `KILN_BACKGROUND=1`) would then hijack the training thread's module calls. This
recorder is a `TorchDispatchMode`, whose state is per thread.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

_METADATA_OPS = (torch.ops.aten.size.default, torch.ops.aten.stride.default,
                 torch.ops.aten.storage_offset.default)


class _Recorder(TorchDispatchMode):
    def __init__(self, table: dict[Any, Callable[..., Any]]) -> None:
        super().__init__()
        self.table = table
        self.graph = fx.Graph()
        self.root = torch.nn.Module()  # holds constants the function creates
        self._nodes: dict[int, fx.Node] = {}
        self._alive: list[torch.Tensor] = []  # keeps ids unique while recording

    def bind(self, tensor: torch.Tensor, node: fx.Node) -> None:
        self._nodes[id(tensor)] = node
        self._alive.append(tensor)
        node.meta["val"] = tensor

    def node_of(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        node = self._nodes.get(id(value))
        if node is None:  # a tensor the function made from nothing: a constant
            name = f"_tensor_constant{len(self.root._buffers)}"
            self.root.register_buffer(name, value.detach().clone())
            node = self.graph.get_attr(name)
            self.bind(value, node)
        return node

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # As make_fx does: the table first, then the op's own composite implementation
        # (ops called from here are below autograd, where those are not applied for us).
        decomposition = self.table.get(func)
        with self:  # record what a decomposition runs, decomposing further
            if decomposition is not None:
                out = decomposition(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            if func not in _METADATA_OPS:
                out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        name = self.graph._target_to_str(func.overloadpacket.__name__)  # as make_fx names
        node = self.graph.create_node("call_function", func, tree_map(self.node_of, args),
                                      tree_map(self.node_of, kwargs), name=name)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            self.bind(out, node)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = out
            for i, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    self.bind(item, self.graph.call_function(operator.getitem, (node, i)))
        return out


def record(fn: Callable[..., Any], inputs: list[torch.Tensor],
           table: dict[Any, Callable[..., Any]]) -> fx.GraphModule:
    """The aten graph of `fn(*inputs)` (meta tensors), ops in `table` decomposed.
    Raises what `fn` raises (a data-dependent op on meta tensors, say)."""
    recorder = _Recorder(table)
    for i, tensor in enumerate(inputs):
        recorder.bind(tensor, recorder.graph.placeholder(f"arg{i}_1"))
    with recorder:
        out = fn(*inputs)
    recorder.graph.output(tree_map(recorder.node_of, out))
    # Lazy: its Python code is made only if read; splicing copies the graph, not the code.
    return _LazyGraphModule(recorder.root, recorder.graph)
