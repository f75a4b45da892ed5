"""CUDA graph replay's bookkeeping, on the CPU with a stand-in graph object: which inputs
are read in place and which are copied, outputs left in the graph's memory unless a
caller keeps them, and when replay waits, captures again or gives up."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import compiler.runtime.cudagraphs as cg


class _Stream:
    def wait_stream(self, other: object) -> None:
        return None


class _Graph:
    """Replays by re-running the Python function registered while capturing."""

    def __init__(self) -> None:
        self.fn: Callable[[], None] | None = None
        self.capturing = False
        self.captures = 0
        self.current: _Graph = self

    def replay(self) -> None:
        assert self.fn is not None
        self.fn()


@pytest.fixture
def graph(monkeypatch: pytest.MonkeyPatch) -> _Graph:
    g = _Graph()

    @contextlib.contextmanager
    def capture(captured: _Graph, capture_error_mode: str = "global") -> Iterator[None]:
        captured.capturing, captured.captures = True, captured.captures + 1
        yield
        captured.capturing = False

    g.current = g  # what torch.cuda.CUDAGraph() hands out (a test may switch it)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: g.current)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", capture)
    return g


def _graphed(graph: _Graph, compute: Callable[[list[torch.Tensor]], Any],
             shapes: Callable[[list[torch.Tensor]], list[torch.Tensor]]) -> Callable[[list], Any]:
    """A run function: allocates its outputs, computes into them, and while capturing
    registers the computation on those buffers as the graph's replay."""

    def run(xs: list[torch.Tensor]) -> Any:
        outs = shapes(xs)

        def replay() -> None:
            for o, v in zip(outs, compute(xs), strict=True):
                o.copy_(v)

        replay()
        if graph.capturing:
            graph.fn = replay
        return tuple(outs)

    return run


def _call(runner: cg.GraphRunner, run: Callable[[list], Any], xs: list) -> tuple[Any, bool]:
    """What Built does: the runner's outputs, else a plain run; and whether it replayed."""
    out = runner(xs)
    return (run(xs), False) if out is None else (out, True)


def _affine(graph: _Graph) -> Callable[[list], Any]:
    return _graphed(graph, lambda xs: [xs[0] * 2 + xs[1]], lambda xs: [torch.empty(4)])


def _primed(graph: _Graph) -> tuple[Callable[[list], Any], cg.GraphRunner, torch.Tensor,
                                    torch.Tensor]:
    """The affine graph, its runner after a first call on (x, w), and x and w."""
    run = _affine(graph)
    runner = cg.GraphRunner(run, steps=2)
    x, w = torch.randn(4), torch.randn(4)
    runner([x, w])
    return run, runner, x, w


def test_moving_inputs_are_copied_and_parameters_read_in_place(graph: _Graph) -> None:
    run = _affine(graph)
    runner = cg.GraphRunner(run, steps=2)
    weight = torch.randn(4)
    assert runner([torch.randn(4), weight]) is None  # first call: plain launches
    replayed = []
    for _ in range(4):  # the activation moves every call; the weight stays
        x = torch.randn(4)
        (got,), did = _call(runner, run, [x, weight])
        replayed.append(did)
        torch.testing.assert_close(got, x * 2 + weight)
        del got
    # The second call waits: an input that moves once may be settling, one that moves on
    # two calls in a row moves every call, and is copied in.
    assert replayed == [False, True, True, True] and runner.staged == [0]
    assert [i for i, _ in runner.direct] == [1]
    weight.add_(1.0)  # updated in place (an optimizer step): the graph sees it
    x = torch.randn(4)
    (got,), did = _call(runner, run, [x, weight])
    assert did
    torch.testing.assert_close(got, x * 2 + weight)


def test_outputs_stay_in_the_graphs_memory_when_nobody_keeps_them(graph: _Graph) -> None:
    run, runner, x, w = _primed(graph)
    ptrs = []
    for _ in range(3):
        (got,), did = _call(runner, run, [x, w])
        assert did
        ptrs.append(got.data_ptr())
        torch.testing.assert_close(got, x * 2 + w)
        del got
    assert len(set(ptrs)) == 1 and ptrs[0] == runner.bases[0].data_ptr()  # never copied
    assert runner.copied == set() and runner.recaptures == 0


def test_an_output_a_caller_keeps_is_never_overwritten(graph: _Graph) -> None:
    """A loss kept across steps (or a gradient `.grad` stole): the call that finds it still
    held runs without the graph, and the next capture copies that output out."""
    run = _affine(graph)
    runner = cg.GraphRunner(run, steps=2)
    w = torch.randn(4)
    runner([torch.randn(4), w])
    runner([torch.randn(4), w])  # x moves on every call: the runner sees it twice, then captures
    x1 = torch.randn(4)
    (kept,), did = _call(runner, run, [x1, w])
    assert did and kept.data_ptr() == runner.bases[0].data_ptr()
    x2 = torch.randn(4)
    (got,), did = _call(runner, run, [x2, w])
    assert not did and runner.recaptures == 1  # replaying would have overwritten `kept`
    torch.testing.assert_close(kept, x1 * 2 + w)
    torch.testing.assert_close(got, x2 * 2 + w)
    history = [kept, got]
    for _ in range(4):  # the caller keeps every output from now on
        x = torch.randn(4)
        (got,), did = _call(runner, run, [x, w])
        history.append(got)
        torch.testing.assert_close(got, x * 2 + w)
    assert runner.graph is not None and runner.copy_outputs == {0}
    assert runner.replays >= 4 and graph.captures == 2
    torch.testing.assert_close(history[0], x1 * 2 + w)  # nothing was overwritten
    assert len({h.data_ptr() for h in history}) == len(history)


def test_a_moved_parameter_makes_one_call_run_without_the_graph(graph: _Graph) -> None:
    run, runner, x, w = _primed(graph)
    assert _call(runner, run, [x, w])[1] and [i for i, _ in runner.direct] == [0, 1]
    for n in range(4):
        w = torch.randn(4)  # a new (small) "parameter" every call: copied after two misses
        (got,), did = _call(runner, run, [x, w])
        assert did == (n >= 2)  # the miss, a wait (w may settle), then a capture copying w
        torch.testing.assert_close(got, x * 2 + w)
        del got
    assert runner.recaptures == 1 and runner.staged == [1]


def test_capture_is_given_up_after_too_many_refusals(graph: _Graph) -> None:
    run, runner, x, w = _primed(graph)
    kept = []
    for _ in range(3 * (cg.MAX_RECAPTURES + 2)):
        (got,), _ = _call(runner, run, [x, w])
        kept.append(got)  # held forever; but a new output of each capture copies
        torch.testing.assert_close(got, x * 2 + w)
    assert not runner.failed and runner.recaptures == 1
    runner2 = cg.GraphRunner(run, steps=2)
    runner2.max_copy_bytes = 8  # w is too large to copy: it must stay put to be read in place
    for _ in range(cg.MAX_RECAPTURES + 2):
        w = torch.randn(4)
        for _ in range(3):  # stays for three calls (capture, replay), then moves
            (got,), _ = _call(runner2, run, [x, w])
            torch.testing.assert_close(got, x * 2 + w)
            del got
    assert runner2.failed and runner2.graph is None


def test_big_copies_wait_and_then_are_not_worth_a_graph(graph: _Graph) -> None:
    run = _affine(graph)
    runner = cg.GraphRunner(run, steps=2)
    big = (cg.COPY_BYTES_PER_STEP * 2) // 4 + 1
    for _ in range(2 * cg.MAX_WAIT + 2):
        assert runner([torch.randn(big), torch.randn(1)]) is None
    assert runner.failed


def test_a_backward_reads_its_forwards_outputs_in_place(graph: _Graph) -> None:
    """The forward's outputs stay at fixed addresses once it replays, so the backward
    captures (one call later) with them read in place instead of copied."""
    fwd_graph, bwd_graph = graph, _Graph()
    fwd = _graphed(fwd_graph, lambda xs: [xs[0] * xs[1]], lambda xs: [torch.empty(64)])

    def bwd(xs: list[torch.Tensor]) -> tuple[torch.Tensor]:
        out = torch.empty(64)
        out.copy_(xs[0] * xs[1])  # saved activation * incoming gradient
        if bwd_graph.capturing:  # a real graph holds no tensor: replay reads the memory
            assert xs[0].data_ptr() == fr.bases[0].data_ptr()
            grad_in = xs[1]  # the runner's static copy

            def replay() -> None:
                out.copy_(fr.bases[0] * grad_in)

            bwd_graph.fn = replay
        return (out,)

    fr, br = cg.GraphRunner(fwd, steps=2), cg.GraphRunner(bwd, steps=2)
    big = torch.randn(64)
    # The saved activation is small enough to copy: the backward still waits for it to settle
    # rather than copy it in on every replay (resnet18's training backward copied 78 inputs).
    assert 64 * 4 < br.max_copy_bytes
    w = torch.randn(64)
    for _ in range(6):
        (saved,), _ = _call(fr, fwd, [big, w])
        g = torch.ones(1)  # a fresh (small) incoming gradient every step: copied
        graph.current = bwd_graph
        (grad,), _ = _call(br, bwd, [saved, g])
        graph.current = fwd_graph
        torch.testing.assert_close(grad, big * w * g)
        del saved, grad
    assert br.graph is not None and [i for i, _ in br.direct] == [0]  # saved: in place
    assert not fr.failed and not br.failed and br.replays >= 2
    assert fr.recaptures == br.recaptures == 0 and fr.copied == br.copied == set()


def test_outputs_keep_the_strides_and_aliasing_of_views(graph: _Graph) -> None:
    """q, k and v as slices of one qkv buffer (what a forward saves for its backward): in
    the graph's memory or copied out, they keep their strides and share one buffer."""

    def run(xs: list[torch.Tensor]) -> object:
        qkv, dense = torch.empty(2, 8, 3, 4), torch.empty(2, 8, 12)

        def compute() -> None:
            qkv.copy_((xs[0] * 3).view(2, 8, 3, 4))
            dense.copy_(xs[0] + 1)

        compute()
        if graph.capturing:
            graph.fn = compute
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3)) + (dense,)

    runner = cg.GraphRunner(run, steps=2)
    xs = [torch.randn(2, 8, 12) for _ in range(5)]
    runner([xs[0]])
    kept = []
    for x in xs[1:]:
        out, _ = _call(runner, run, [x])
        *views, dense = out
        want = (x * 3).view(2, 8, 3, 4)
        for i, view in enumerate(views):
            assert view.stride() == want[:, :, i].transpose(1, 2).stride() == (96, 1, 12)
            torch.testing.assert_close(view, want[:, :, i].transpose(1, 2))
        assert len({v.untyped_storage().data_ptr() for v in views}) == 1
        torch.testing.assert_close(dense, x + 1)
        kept.append(out)  # every output kept: from the second capture on, copied out
    assert runner.copy_outputs == {0, 1, 2, 3}
    for x, out in zip(xs[1:], kept, strict=True):  # none was overwritten
        torch.testing.assert_close(out[3], x + 1)


def test_an_output_that_is_a_view_of_a_parameter_is_a_view_of_the_current_one(graph: _Graph) -> None:
    def run(xs: list[torch.Tensor]) -> object:
        out = torch.empty(4)

        def compute() -> None:
            out.copy_(xs[0] + 1)

        compute()
        if graph.capturing:
            graph.fn = compute
        return out, xs[1][1:3]

    runner = cg.GraphRunner(run, steps=2)
    x, w = torch.randn(4), torch.randn(4)
    runner([x, w])
    for _ in range(3):
        (a, view), did = _call(runner, run, [x, w])
        assert did and view.data_ptr() == w[1:3].data_ptr() and view.stride() == (1,)
        del a, view
    assert runner.bases and all(b.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
                                for b in runner.bases)


def test_a_replay_checks_the_inputs_first(graph: _Graph) -> None:
    run = _affine(graph)
    checked = []

    def check(xs: list) -> None:
        checked.append(len(xs))
        if xs[0].shape != (4,):
            raise ValueError("input 0: expected torch.float32 [4]")

    runner = cg.GraphRunner(run, steps=2, check=check)
    x, w = torch.randn(4), torch.randn(4)
    runner([x, w])
    _call(runner, run, [x, w])
    assert _call(runner, run, [x, w])[1] and checked  # replayed, after a check
    with pytest.raises(ValueError, match="expected"):
        runner([torch.randn(2), w])  # would have been copied (broadcast) into the graph


def test_a_cpu_tensor_beside_device_tensors_is_never_captured(graph: _Graph) -> None:
    """A CPU scalar is read on the host while capturing: a replay would keep its value."""
    runner = cg.GraphRunner(lambda xs: None, steps=2)
    inputs = [torch.empty(4, device="meta"), torch.tensor(2.0)]
    assert runner(inputs) is None and runner.failed and graph.captures == 0


def test_graphs_that_write_into_their_inputs_are_found() -> None:
    """Such graphs never capture: a copied-in input would take the writes, not the caller's."""
    from torch import fx

    from compiler.runtime.built import _writes_inputs

    aten = torch.ops.aten
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(aten.add_.Tensor, (g.call_function(aten.view.default, (x, [2])), 1.0))
    assert _writes_inputs(g)  # through a view
    g = fx.Graph()
    x = g.placeholder("x")
    g.call_function(aten.bernoulli_.float, (g.call_function(aten.empty_like.default, (x,)), 0.5))
    assert not _writes_inputs(g)  # a fresh buffer (dropout's mask)
    g = fx.Graph()
    g.call_function(aten.mul.Tensor, (g.placeholder("x"), 2))
    assert not _writes_inputs(g)
