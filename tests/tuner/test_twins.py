"""Twins (the same kernel in each repeated layer) are measured once and share the winner."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import tuner
from tests.tuner.fakes import FakeGraphRunner
from tuner.session import twin_keys

H200 = {"arch": "sm_90", "name": "NVIDIA H200"}


def _graph(fn, *inputs):
    import compiler
    from compiler.lowering.tracing import trace_inference

    gm, ins = trace_inference(fn, list(inputs))
    return compiler.from_wire(compiler.to_wire(gm, ins)), ins


@functools.cache
def _gpt_train_fwd(layers: int):
    import compiler
    from compiler.lowering.tracing import trace_training
    from examples.models import GPT, GPTConfig

    cfg = GPTConfig(layers=layers)
    torch.manual_seed(0)
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    gm, _, ins, _ = trace_training(GPT(cfg).train(), [idx, idx])
    return compiler.from_wire(compiler.to_wire(gm, ins))


def _keys(graph, base: dict) -> dict[str, str]:
    import compiler

    schedule = compiler.Schedule.from_json(base)
    return twin_keys(graph, schedule, compiler.build(graph, schedule))


class TwinAwareFake(FakeGraphRunner):
    """Answers `load` as the child does: with each kernel's twin key."""

    def load(self, graph_json: dict, schedule_json: dict, seed: int = 0) -> dict:
        import compiler

        super().load(graph_json, schedule_json, seed)
        return {"ok": True, "twins": _keys(compiler.from_wire(graph_json), schedule_json)}


def test_twin_keys_group_exactly_the_identical_kernels() -> None:
    import compiler

    graph = _gpt_train_fwd(4)
    target = compiler.Target.named(**H200)
    base = compiler.heuristic_schedule(graph, target).to_json()
    built = compiler.build(graph, compiler.Schedule.from_json(base))
    keys = _keys(graph, base)
    sources = {k.name: k.source_hash for k in built.kernels}
    assert len(set(keys.values())) == len(set(sources.values())) < len(keys)
    for a in keys:
        for b in keys:
            assert (keys[a] == keys[b]) == (sources[a] == sources[b]), (a, b)
    # As ATen calls the matmuls generate their epilogues only; their keys still tell apart
    # the matmuls that differ (shapes, operand layouts), and only those.
    aten = copy.deepcopy(base)
    for k in aten["kernels"]:
        if k["kind"] == "matmul":
            k["variant"] = "aten"
    aten_keys = _keys(graph, aten)
    for a in keys:
        for b in keys:
            assert (aten_keys[a] == aten_keys[b]) == (keys[a] == keys[b]), (a, b)


def test_tune_measures_each_distinct_kernel_once() -> None:
    import compiler

    graph = _gpt_train_fwd(4)
    target = compiler.Target.named(**H200)
    keys = _keys(graph, compiler.heuristic_schedule(graph, target).to_json())
    fake = TwinAwareFake(lambda c: 1.0 + abs(c.config.get("XBLOCK", 64) - 256) / 256)
    result = tuner.tune(graph, target, tuner.Budget(trials=400), runner=fake)

    first: dict[str, str] = {}
    for name, key in keys.items():
        first.setdefault(key, name)
    measured = {c.kernel for c, _ in fake.calls}
    assert measured == set(first.values())  # the first of each group, every group
    assert {m["kernel"] for m in result.measurements} == measured
    chosen = {k["name"]: (k["variant"], k["config"]) for k in result.schedule.to_json()["kernels"]}
    for k in result.kernels:
        lead = first[keys[k.name]]
        assert k.twin_of == (None if lead == k.name else lead)
        assert chosen[k.name] == chosen[lead]
        if k.twin_of:
            assert k.trials == 0 and k.winner.kernel == k.name
            assert k.winner.variant == chosen[lead][0]


def test_without_twin_keys_every_kernel_is_searched() -> None:
    import compiler

    graph = _gpt_train_fwd(2)
    target = compiler.Target.named(**H200)
    fake = FakeGraphRunner(lambda c: 1.0)  # its load answers nothing
    result = tuner.tune(graph, target, tuner.Budget(trials=400), runner=fake)
    assert {c.kernel for c, _ in fake.calls} == {k.name for k in result.kernels}
    assert all(k.twin_of is None for k in result.kernels)


@pytest.mark.xdist_group("tuner_runner")
def test_real_runner_tunes_two_identical_layers_once() -> None:
    import compiler

    graph, ins = _graph(lambda x, w1, w2: torch.relu(torch.relu(x @ w1) @ w2),
                        torch.randn(16, 32), torch.randn(32, 32), torch.randn(32, 32))
    target = compiler.Target.detect("cpu")
    result = tuner.tune(graph, target, tuner.Budget(trials=4), device="cpu")

    first, second = result.kernels
    assert second.twin_of == first.name and second.trials == 0
    assert {m["kernel"] for m in result.measurements} == {first.name}
    a, b = result.schedule.to_json()["kernels"]
    assert (a["variant"], a["config"], a["source_hash"]) == (b["variant"], b["config"], b["source_hash"])
    (out,) = compiler.build(graph, result.schedule)(*ins)
    (ref,) = graph.to_fx()(*ins)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
