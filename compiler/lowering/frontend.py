"""Accept either a `compiler.Graph` or an fx GraphModule plus example inputs, and lower it.

Lowering is deterministic, so `heuristic_schedule` and `build` of one graph share the
result through a small cache keyed by the graph's hash.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from compiler.ir import Program, TensorMeta
from compiler.lowering.lower import lower_fx, lowering_options

_CACHE: OrderedDict[str, Program] = OrderedDict()
_LOCK = threading.Lock()
_CACHE_SIZE = 32


def lower_graph(graph: Any, example_inputs: Sequence[Any] | None = None) -> tuple[Program, str]:
    """(Program, graph_hash) of a `compiler.Graph` or an fx GraphModule with example inputs."""
    if isinstance(graph, fx.GraphModule):
        if example_inputs is None:
            raise ValueError("an fx GraphModule needs example_inputs (tensors or metas)")
        ghash = _fx_hash(graph, list(example_inputs))
    elif hasattr(graph, "to_fx") and hasattr(graph, "inputs"):
        from compiler.wire.keys import graph_hash

        ghash = graph_hash(graph)
    else:
        raise TypeError(f"expected compiler.Graph or torch.fx.GraphModule, got {type(graph).__name__}")
    key = f"{ghash}:{lowering_options()}"  # the environment's lowering options change kernels
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key], ghash
    # Only a miss rebuilds the fx graph: the tuner builds one graph once per candidate.
    if isinstance(graph, fx.GraphModule):
        gm, metas, owned = graph, list(example_inputs), False
    else:  # a GraphModule of its own, made here
        gm, metas, owned = graph.to_fx(), list(graph.inputs), True
    program = lower_fx(gm, metas, owned=owned)
    with _LOCK:
        _CACHE[key] = program
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return program, ghash


def _fx_hash(gm: fx.GraphModule, metas: list[Any]) -> str:
    """The wire graph hash when the wire module can encode this graph, else a local one."""
    try:
        from compiler.wire.graph import to_wire_and_graph
        from compiler.wire.keys import graph_hash

        return graph_hash(to_wire_and_graph(gm, metas)[1])  # from_wire(to_wire(...))'s hash
    except Exception:  # noqa: BLE001 - unsupported by the wire format: hash locally
        h = hashlib.sha256(gm.code.encode())
        for m in metas:
            t = TensorMeta.of(m) if m is not None else None
            h.update(repr(t).encode())
        for name, buf in sorted(gm.named_buffers()):
            h.update(name.encode())
            raw = buf.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # any dtype
            h.update(str(buf.dtype).encode())
            h.update(raw.numpy().tobytes())
        return h.hexdigest()
