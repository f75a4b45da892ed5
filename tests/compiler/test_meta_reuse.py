"""Lowering runs the graph on the meta device after each pass that changes it; a rerun
keeps the metadata of every node whose op, arguments and arguments' metadata did not
change (`propagate_meta(reuse=True)`), and gives what a full run gives."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import fx

from compiler.ir import TensorMeta
from compiler.lowering import lower
from compiler.lowering.lower import lower_fx, propagate_meta
from tests.compiler.oputil import rand, trace


def _graph() -> tuple[fx.GraphModule, list[TensorMeta]]:
    def fn(x: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x + 1
        return y * 2, x.sum(0), x2
    x, x2 = rand((4, 6)), rand((8, 6))
    return trace(fn, x, x2), [TensorMeta.of(x), TensorMeta.of(x2)]


def test_a_rerun_keeps_unchanged_nodes_and_runs_changed_ones_and_their_users() -> None:
    gm, metas = _graph()
    propagate_meta(gm, metas)
    second = [n for n in gm.graph.nodes if n.op == "placeholder"][1]
    add, mul, total = (next(n for n in gm.graph.nodes if n.op == "call_function" and
                            n.target.__name__.startswith(p)) for p in ("add", "mul", "sum"))
    # A wrong record on the unchanged sum shows that the rerun kept it without running it.
    marked = dataclasses.replace(total.meta["kiln_meta"], dtype=torch.float64)
    total.meta["kiln_meta"] = marked
    add.args = (second, *add.args[1:])  # y = x2 + 1: add and its user mul change
    propagate_meta(gm, metas, reuse=True)
    assert total.meta["kiln_meta"] is marked
    assert add.meta["kiln_meta"].shape == mul.meta["kiln_meta"].shape == (8, 6)
    propagate_meta(gm, metas)  # a full run records what the op gives
    assert total.meta["kiln_meta"].dtype == torch.float32


def _all_metas(program) -> list:
    return [(n.name, n.meta.get("kiln_meta")) for n in program.gm.graph.nodes]


def test_lowering_with_reuse_gives_what_full_runs_give(monkeypatch) -> None:
    x, w, b = rand((16, 32), seed=1), rand((32,), seed=2), rand((32,), seed=3)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.layer_norm(x, (32,), w, b)
        return torch.softmax(F.gelu(h), -1), h.var(0), (h.t() @ x).sum(0)

    gm = trace(fn, x, w, b)
    metas = [TensorMeta.of(t) for t in (x, w, b)]
    reused = lower_fx(gm, metas)
    monkeypatch.setattr(lower, "_recorded", lambda node, key: None)
    full = lower_fx(gm, metas)
    assert _all_metas(reused) == _all_metas(full)
    assert not any("kiln_meta_key" in n.meta for n in reused.gm.graph.nodes)
