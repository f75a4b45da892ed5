"""A training step run from its plan reaches its compiled graphs as the same step through
AOTAutograd does (issue 34): per step the forward's and the backward's built graph are each
called once, through their CUDA graph runners, which replay (no launcher run, no capture
made again), and nothing stands between the caller and the built graph. CUDA graphs are
stood in for over CPU tensors and kernels are stubbed (`bench.plan_host_path`); no speed is
asserted here (the benchmark measures it)."""

from __future__ import annotations

import copy
import weakref
from typing import Any

import pytest
import torch
from torch import nn

import kiln
from bench.cases import GPTBlock
from bench.models import loss_of
from bench.plan_host_path import counted_calls, stand_in_cuda_graphs
from compiler.runtime import cudagraphs
from kiln import plans, session
from tests.kiln.helpers import ConvBN, fresh_process, step_outputs

pytestmark = pytest.mark.usefixtures("kiln_state")


def _train_steps(compiled: nn.Module, model: nn.Module, x: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        loss_of(compiled(x)).backward()


def _runners() -> list[Any]:
    return [g.built._graphs for g in session.compiled_graphs()]


def _warm_until_captured(compiled: nn.Module, model: nn.Module, x: torch.Tensor) -> None:
    """Launcher runs, then both graphs captured: capture waits while inputs' addresses
    settle, and how many steps that takes depends on where the allocator puts them."""
    for _ in range(4 * cudagraphs.MAX_WAIT):
        _train_steps(compiled, model, x, 1)
        runners = _runners()
        if len(runners) == 2 and all(r is not None and r.graph is not None for r in runners):
            return
    raise AssertionError(f"graphs not captured: {[vars(r) for r in runners if r]}")


def _counted_steps(compiled: nn.Module, model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """The calls of 3 steps after both graphs are captured, in a window where neither graph
    was captured again. On the CPU stand-in a tensor's address is wherever malloc puts it,
    and a saved activation that lands elsewhere once makes its graph capture again (the
    CUDA caching allocator keeps them put): such a window is measured again, a few times."""
    for _ in range(5):
        _warm_until_captured(compiled, model, x)
        before = [r.recaptures for r in _runners()]
        with counted_calls() as counts:
            _train_steps(compiled, model, x, 3)
        if [r.recaptures for r in _runners()] == before:
            return counts
    raise AssertionError(f"a graph was captured again in every window: {counts}")


def test_a_planned_step_replays_the_same_cuda_graphs_as_an_unplanned_one(monkeypatch):
    kiln.configure(url=None)
    # On the stand-in, malloc may move a saved activation on several steps in a row (the
    # CUDA caching allocator keeps them put): a runner must not give replay up for that.
    monkeypatch.setattr(cudagraphs, "MAX_RECAPTURES", 1000)
    keys = {}
    with stand_in_cuda_graphs():
        for planned in (False, True):  # AOTAutograd (the plan recorded), then the plan
            fresh_process()
            torch.manual_seed(0)
            model = nn.Sequential(GPTBlock(32, 2), GPTBlock(32, 2))
            x = torch.randn(1, 8, 32)
            compiled = torch.compile(model, backend=kiln.remote_compile)
            counts = _counted_steps(compiled, model, x)
            assert kiln.stats().get("plans_used", 0) == int(planned)
            assert counts == {"graph_calls": 6, "runner_calls": 6, "replays": 6,
                              "launcher_runs": 0}, planned
            graphs = {g.kind: g for g in session.compiled_graphs()}
            assert set(graphs) == {"forward", "backward"}
            for graph in graphs.values():
                runner = graph.built._graphs
                assert runner is not None and runner.graph is not None, (planned, graph)
                assert not runner.failed, (planned, vars(runner))
                # The caller's call goes straight to the built graph's boxed entry point.
                assert graph._impl == graph.built.call_boxed, (planned, graph)
            keys[planned] = {kind: g.key for kind, g in graphs.items()}
    assert keys[True] == keys[False]  # the very graphs, built from the same schedules


def _planned_step(monkeypatch: pytest.MonkeyPatch, spy_backward: Any) -> None:
    """ConvBN's training step recorded, then run from its plan with `spy_backward(runner,
    grads, graph_call, args, x)` around each call of the plan's backward graph (`x` the
    step's input)."""
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = ConvBN(), torch.randn(2, 3, 10, 10)
    step_outputs(copy.deepcopy(model), x, compiled=True)  # records the plan
    fresh_process()
    backward = plans._PlanFunction.backward

    def spied(ctx: Any, *grads: Any) -> Any:
        graph = ctx.runner.backward_graph()
        real = graph._impl
        graph._impl = lambda args: spy_backward(ctx.runner, grads, real, args, x)
        try:
            return backward(ctx, *grads)
        finally:
            graph._impl = real

    monkeypatch.setattr(plans._PlanFunction, "backward", staticmethod(spied))
    step_outputs(copy.deepcopy(model), x, compiled=True)
    assert kiln.stats()["plans_used"] == 1


def test_an_output_that_takes_no_gradient_gets_none_in_the_planned_backward(monkeypatch):
    """ConvBN's second output is detached: AOTAutograd's runtime hands its backward None for
    it, and so does the plan's (no tensor of zeros made for it on every call)."""
    seen = []

    def spy(runner: Any, grads: Any, real: Any, args: list, x: torch.Tensor) -> Any:
        seen.append([g is None for g in grads])
        return real(args)

    _planned_step(monkeypatch, spy)
    assert seen == [[False, True]]


def test_the_planned_backward_holds_its_saved_values_only_in_its_argument_list(monkeypatch):
    """As through AOTAutograd: once the backward's graph has its boxed argument list, the
    autograd context no longer holds the saved activations, so the graph frees each at its
    last use (the caller's step keeps parameters and input alive, not activations)."""
    outlived = []

    def spy(runner: Any, grads: Any, real: Any, args: list, x: torch.Tensor) -> Any:
        saved = args[:len(args) - len(runner.tangents)]  # then the output gradients
        activations = [weakref.ref(t) for t in saved
                       if not t.requires_grad and t is not x and t.dim() > 1]
        del saved
        assert activations
        out = real(args)  # clears the list
        outlived.append(sum(ref() is not None for ref in activations))
        return out

    _planned_step(monkeypatch, spy)
    assert outlived == [0]
