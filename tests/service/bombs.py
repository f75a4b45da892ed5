"""Small wire graphs that describe a lot of work or memory (issue 15), built by hand so that
making them costs nothing: the bodies are a few hundred bytes whatever `n` is."""

from __future__ import annotations

from typing import Any


def _meta(shape: list[int], dtype: str = "float32") -> dict[str, Any]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.insert(0, step)
        step *= max(size, 1)
    return {"dtype": dtype, "shape": shape, "stride": stride}


def full_relu(n: int) -> dict[str, Any]:
    """`aten.full([n, n])` then relu: no inputs, an n*n intermediate and output."""
    meta = _meta([n, n])
    return {"format": "kiln.graph/1", "inputs": [], "nodes": [
        {"name": "full", "op": "aten.full.default", "args": [[n, n], 1.0],
         "kwargs": {"dtype": {"dtype": "float32"}, "device": {"device": "cpu"},
                    "pin_memory": False}, "meta": meta},
        {"name": "relu", "op": "aten.relu.default", "args": [{"ref": "full"}], "kwargs": {},
         "meta": meta}],
        "outputs": [{"ref": "relu"}]}


def expand_sum(n: int) -> dict[str, Any]:
    """One input element expanded to [n, n], then summed: n*n work from a 1-element input."""
    return {"format": "kiln.graph/1",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 1], "stride": [1, 1],
                        "storage_offset": 0, "requires_grad": False}],
            "nodes": [
                {"name": "big", "op": "aten.expand.default", "args": [{"ref": "x"}, [n, n]],
                 "kwargs": {}, "meta": {"dtype": "float32", "shape": [n, n], "stride": [0, 0]}},
                {"name": "total", "op": "aten.sum.default", "args": [{"ref": "big"}],
                 "kwargs": {}, "meta": _meta([])}],
            "outputs": [{"ref": "total"}]}


def bicubic_chain(count: int, size: int = 64) -> dict[str, Any]:
    """`count` independent `upsample_bicubic2d` nodes of one [1, 1, size, size] input, to
    [size, size + i] for node i: cheap to send, each priced high by wire validation, no two
    alike (validation runs a repeated op on the same arguments once). Its memo outlives a
    graph (a service's serves every submission), so chains meant to cost their full price
    in one process take distinct `size`s: no node of one is a node of another."""
    shape = [1, 1, size, size]
    nodes = [{"name": f"up{i}", "op": "aten.upsample_bicubic2d.default",
              "args": [{"ref": "x"}, [size, size + i], False], "kwargs": {},
              "meta": _meta([1, 1, size, size + i])}
             for i in range(count)]
    return {"format": "kiln.graph/1",
            "inputs": [{"name": "x", **_meta(shape), "storage_offset": 0, "requires_grad": False}],
            "nodes": nodes, "outputs": [{"ref": nodes[-1]["name"]}]}


def sum_sub_chain(steps: int, shape: tuple[int, ...] = (8, 16)) -> dict[str, Any]:
    """`x = x - x.sum(-1, keepdim=True)`, `steps` times: a chain of reductions each reading
    the one before (issue 30: 1200 steps held a worker 552 s while fusion grew one group)."""
    full, row = _meta(list(shape)), _meta([*shape[:-1], 1])
    nodes, prev = [], "x"
    for i in range(steps):
        nodes += [{"name": f"s{i}", "op": "aten.sum.dim_IntList",
                   "args": [{"ref": prev}, [-1], True], "kwargs": {}, "meta": row},
                  {"name": f"d{i}", "op": "aten.sub.Tensor",
                   "args": [{"ref": prev}, {"ref": f"s{i}"}], "kwargs": {}, "meta": full}]
        prev = f"d{i}"
    return {"format": "kiln.graph/1",
            "inputs": [{"name": "x", **full, "storage_offset": 0, "requires_grad": False}],
            "nodes": nodes, "outputs": [{"ref": prev}]}
