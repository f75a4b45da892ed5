"""CUDA graph replay's bookkeeping, on the CPU with a stand-in graph object: which inputs
are read in place and which are copied, and when replay gives up for plain launches."""

from __future__ import annotations

import contextlib

import pytest
import torch

import compiler.runtime.cudagraphs as cg


class _Stream:
    def wait_stream(self, other: object) -> None:
        return None


class _Graph:
    """Replays by re-running the captured Python function on the captured buffers."""

    def __init__(self) -> None:
        self.fn = None

    def replay(self) -> None:
        self.fn()


@pytest.fixture
def graph(monkeypatch: pytest.MonkeyPatch) -> _Graph:
    g = _Graph()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: g)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    return g


def _runner(graph: _Graph, out_tuple: bool) -> cg.GraphRunner:
    def run(xs: list[torch.Tensor]) -> object:
        out = xs[0] * 2 + xs[1]

        def replay() -> None:
            out.copy_(xs[0] * 2 + xs[1])

        graph.fn = replay
        return (out,) if out_tuple else out

    return cg.GraphRunner(run, steps=2)


@pytest.mark.parametrize("out_tuple", [True, False])
def test_moving_inputs_are_copied_and_parameters_read_in_place(graph: _Graph, out_tuple: bool) -> None:
    runner = _runner(graph, out_tuple)
    weight = torch.randn(4)
    assert runner([torch.randn(4), weight]) is None  # first call: plain launches
    for _ in range(3):  # the activation moves every call; the weight stays
        x = torch.randn(4)
        got = runner([x, weight])
        got = got[0] if out_tuple else got
        torch.testing.assert_close(got, x * 2 + weight)
    weight.add_(1.0)  # updated in place (an optimizer step): the graph sees it
    x = torch.randn(4)
    got = runner([x, weight])
    torch.testing.assert_close(got[0] if out_tuple else got, x * 2 + weight)


def test_a_moved_parameter_turns_replay_off(graph: _Graph) -> None:
    runner = _runner(graph, True)
    x, w = torch.randn(4), torch.randn(4)
    runner([x, w])
    runner([x, w])
    assert runner([x, w.clone()]) is None and runner.failed


def test_big_copies_are_not_worth_a_graph(graph: _Graph) -> None:
    runner = _runner(graph, True)
    big = (cg.COPY_BYTES_PER_STEP * 2) // 4 + 1
    runner([torch.randn(big), torch.randn(1)])
    assert runner([torch.randn(big), torch.randn(1)]) is None and runner.failed


def test_replayed_outputs_keep_the_strides_and_aliasing_of_views(graph: _Graph) -> None:
    """q, k and v as slices of one qkv buffer (what a forward saves for its backward): the
    copies out of the graph keep their strides, and still share one buffer."""

    def run(xs: list[torch.Tensor]) -> object:
        qkv, dense = torch.empty(2, 8, 3, 4), torch.empty(2, 8, 12)

        def compute() -> None:
            qkv.copy_((xs[0] * 3).view(2, 8, 3, 4))
            dense.copy_(xs[0] + 1)

        graph.fn = compute
        compute()
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3)) + (dense,)

    runner = cg.GraphRunner(run, steps=2)
    xs = [torch.randn(2, 8, 12) for _ in range(3)]  # all alive: three addresses
    runner([xs[0]])
    for x in xs[1:]:
        *views, dense = runner([x])
        want = (x * 3).view(2, 8, 3, 4)
        for i, view in enumerate(views):
            assert view.stride() == want[:, :, i].transpose(1, 2).stride() == (96, 1, 12)
            torch.testing.assert_close(view, want[:, :, i].transpose(1, 2))
        assert len({v.untyped_storage().data_ptr() for v in views}) == 1
        assert views[0].untyped_storage().data_ptr() != runner.outputs[0].untyped_storage().data_ptr()
        torch.testing.assert_close(dense, x + 1)
