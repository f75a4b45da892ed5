"""A kernel's source depends on what it computes, never on where it sits in the graph: a
model's repeated layers give identical kernels, which compile (and load) once."""

from __future__ import annotations

import functools

import pytest
import torch

import compiler
from compiler.lowering.tracing import trace_inference, trace_training
from examples.models import GPT, GPTConfig


@functools.cache
def _gpt_graphs(layers: int) -> dict[str, tuple[torch.fx.GraphModule, list]]:
    cfg = GPTConfig(layers=layers)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    tgt = torch.randint(0, cfg.vocab, (2, cfg.seq))
    fwd, bwd, fwd_in, bwd_in = trace_training(model.train(), [idx, tgt])
    gm, inputs = trace_inference(model.eval(), [idx, tgt])
    return {"train_fwd": (fwd, fwd_in), "train_bwd": (bwd, bwd_in), "fwd": (gm, inputs)}


def _built(layers: int, graph: str) -> compiler.Built:
    gm, inputs = _gpt_graphs(layers)[graph]
    return compiler.build(gm, None, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["train_fwd", "train_bwd", "fwd"])
def test_twelve_layers_compile_no_more_distinct_kernels_than_two(graph: str) -> None:
    two, twelve = _built(2, graph), _built(12, graph)
    assert len(twelve.kernels) > len(two.kernels)
    assert {k.source_hash for k in twelve.kernels} == {k.source_hash for k in two.kernels}


def test_identical_kernels_share_one_module_and_function() -> None:
    built = _built(4, "train_fwd")
    fns: dict[str, object] = {}
    by_name = {k.name: k.source_hash for k in built.kernels}
    for launch in built.launches():
        fn = fns.setdefault(by_name[launch.kernel], launch.fn)
        assert fn is launch.fn, launch.kernel
    assert len(fns) < len(built.launches())


def test_schedule_names_stay_unique_while_sources_repeat() -> None:
    built = _built(2, "train_bwd")
    names = [k.name for k in built.schedule.kernels]
    assert len(set(names)) == len(names)
    assert len({k.source_hash for k in built.schedule.kernels}) < len(names)
    again = _built(2, "train_bwd")
    assert [k.source for k in again.kernels] == [k.source for k in built.kernels]


def test_source_names_no_graph_node() -> None:
    for k in _built(2, "train_fwd").kernels:
        assert k.nodes
        for node in k.nodes:
            assert f" {node}:" not in k.source and f" {node}," not in k.source, (k.name, node)
        fn_name = k.source.rsplit("\ndef ", 1)[1].split("(", 1)[0]  # helpers come first
        assert fn_name.startswith(k.name.rsplit("_", 1)[0] + "_") and fn_name != k.name
