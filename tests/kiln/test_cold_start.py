"""The client's first compile (issue 14, cold compile time): each graph is converted and
validated once (the key still the one `from_wire` of its wire gives, which the service
computes), and the compile workers and Triton's loader are prepared once per process."""

from __future__ import annotations

import threading

import pytest
import torch

import compiler
import kiln
from compiler import aot
from compiler.runtime import loading
from compiler.wire import graph as wire_graph
from kiln import ahead, backend, resolve, session, warmup
from tests.kiln.helpers import train_mlp

pytestmark = pytest.mark.usefixtures("kiln_state")


def test_each_graph_is_validated_once_and_keyed_as_from_wire_keys_its_wire(monkeypatch) -> None:
    runs = []
    infer = wire_graph.infer_meta
    monkeypatch.setattr(wire_graph, "infer_meta", lambda *a, **k: runs.append(1) or infer(*a, **k))
    kiln.configure(url=None)
    train_mlp(steps=2)
    graphs = session.compiled_graphs()
    assert sorted(g.kind for g in graphs) == ["backward", "forward"]
    assert len(runs) == 2  # one meta run per graph (to_wire + from_wire ran two each)
    for g in graphs:
        assert g.key == compiler.tuning_key(compiler.from_wire(g.wire), g.target)
        assert g.wire == compiler.to_wire(g.gm, list(g.graph.inputs))


def test_workers_start_and_the_loader_is_prepared_once_per_process(monkeypatch) -> None:
    started, prepared = [], threading.Event()
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(aot, "start",
                        lambda: started.append(threading.current_thread().name))

    def prepare() -> None:
        calls.append(threading.current_thread().name)
        prepared.set()

    monkeypatch.setattr(loading, "prepare_loading", prepare)
    monkeypatch.setattr(warmup.PROCESS, "preparing", None)
    warmup.start_compile_workers(expect_binaries=False)
    warmup.start_compile_workers(expect_binaries=False)
    assert prepared.wait(10)
    warmup.PROCESS.preparing.join(10)
    assert started == ["kiln-prepare"] and calls == ["kiln-prepare"]  # off the tracing thread, once
    assert "seconds:prepare" in kiln.stats()


def test_with_a_service_to_load_binaries_from_workers_wait_for_a_compile(monkeypatch) -> None:
    started, prepared = [], threading.Event()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(aot, "start", lambda: started.append(1))
    monkeypatch.setattr(loading, "prepare_loading", prepared.set)
    monkeypatch.setattr(warmup.PROCESS, "preparing", None)
    warmup.start_compile_workers(expect_binaries=True)
    assert prepared.wait(10)
    warmup.PROCESS.preparing.join(10)
    assert started == []  # compile_ahead starts workers when a kernel is to be compiled


def test_workers_that_cannot_start_are_warned_and_the_loader_is_not_prepared(
        monkeypatch, caplog) -> None:
    prepared = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def fail() -> None:
        raise OSError("no processes left")

    monkeypatch.setattr(aot, "start", fail)
    monkeypatch.setattr(loading, "prepare_loading", lambda: prepared.append(1))
    monkeypatch.setattr(warmup.PROCESS, "preparing", None)
    with caplog.at_level("WARNING", logger="kiln"):
        warmup.start_compile_workers(expect_binaries=False)
        warmup.PROCESS.preparing.join(10)
    assert "compile workers did not start (OSError: no processes left)" in caplog.text
    assert not prepared


def test_a_loader_that_cannot_be_prepared_costs_nothing_but_the_try(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(aot, "start", lambda: None)

    def fail() -> None:
        raise RuntimeError("0 active drivers")

    monkeypatch.setattr(loading, "prepare_loading", fail)
    monkeypatch.setattr(warmup.PROCESS, "preparing", None)
    warmup.start_compile_workers(expect_binaries=False)
    warmup.PROCESS.preparing.join(10)
    assert not warmup.PROCESS.preparing.is_alive()


def _aheads_waiting() -> int:
    """Backwards compiled ahead and not taken, over every session."""
    return sum(len(s.aheads) for s in session.sessions())


def _trains_like_eager(steps: int, plans: bool = False) -> None:
    """Train the seed MLP with kiln (no service) and check its losses against eager's.
    Without `plans`, AOTAutograd's runtime runs the step and its backward compiler takes
    the backward compiled ahead; with, the plan recorded on the way runs it at once."""
    kiln.configure(url=None, plans=plans)
    want = train_mlp(steps=steps, backend=None)
    got = train_mlp(steps=steps)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4


def _count_conversions(monkeypatch) -> list[str]:
    kinds: list[str] = []
    real = resolve.convert

    def counted(entry, inputs, count=True):
        kinds.append(entry.kind)
        return real(entry, inputs, count)

    monkeypatch.setattr(resolve, "convert", counted)
    return kinds


def test_the_backward_compiled_ahead_is_taken_by_the_backward_compiler(monkeypatch) -> None:
    monkeypatch.setattr(ahead, "ON_CPU", True)  # CUDA only otherwise
    converted = _count_conversions(monkeypatch)
    _trains_like_eager(steps=3)
    stats = kiln.stats()
    assert stats["backwards_ahead"] == 1
    assert stats["builds"] == 2 and stats["schedules_local"] == 2 and stats["eager"] == 0
    graphs = {g.kind: g for g in session.compiled_graphs()}
    assert set(graphs) == {"forward", "backward"}
    bw = graphs["backward"]
    assert bw.level == "heuristic" and bw.built is not None and bw.built.kernels
    assert bw.key == compiler.tuning_key(compiler.from_wire(bw.wire), bw.target)
    assert not _aheads_waiting()  # taken
    # The backward compiler's graph is a copy of the partitioner's with the same
    # fingerprint: it takes the ahead conversion too instead of converting again.
    assert sorted(converted) == ["backward", "forward"]


def test_the_first_step_runs_its_recorded_plan_with_the_backward_compiled_ahead(monkeypatch) -> None:
    """The plan recorded while AOTAutograd compiled runs the step from the first call on,
    over the same compiled graphs: the forward AOTAutograd compiled and the backward
    compiled ahead (claimed, not compiled again), without AOTAutograd's runtime."""
    monkeypatch.setattr(ahead, "ON_CPU", True)
    converted = _count_conversions(monkeypatch)
    _trains_like_eager(steps=3, plans=True)
    stats = kiln.stats()
    assert stats["plans_now"] == 1 and stats["backwards_ahead"] == 1
    assert stats["builds"] == 2 and stats["eager"] == 0
    assert sorted(converted) == ["backward", "forward"]
    assert {g.kind: g.level for g in session.compiled_graphs()} == {
        "forward": "heuristic", "backward": "heuristic"}
    assert not _aheads_waiting()


def test_without_a_backward_compiled_ahead_the_first_step_runs_through_aotautograd() -> None:
    """On the CPU no backward is compiled ahead (the interpreter is not thread-safe): the
    plan is recorded for the next process and this one runs AOTAutograd's runtime."""
    _trains_like_eager(steps=2, plans=True)
    stats = kiln.stats()
    assert stats.get("plans_now", 0) == 0 and stats["builds"] == 2 and stats["eager"] == 0


def test_a_backward_whose_fingerprint_differs_is_converted_and_matched_by_key(monkeypatch) -> None:
    monkeypatch.setattr(ahead, "ON_CPU", True)
    converted = _count_conversions(monkeypatch)
    calls = iter(range(100))
    monkeypatch.setattr(ahead, "fingerprint", lambda gm, inputs: f"call {next(calls)}")
    _trains_like_eager(steps=2)
    assert kiln.stats()["backwards_ahead"] == 1  # taken by its key, after converting
    assert sorted(converted) == ["backward", "backward", "forward"]


def test_a_backward_compiled_ahead_for_another_graph_is_not_taken(monkeypatch) -> None:
    monkeypatch.setattr(ahead, "ON_CPU", True)
    real = backend._Partition.__call__

    def forward_as_backward(self, joint, *args, **kwargs):
        forward, backward = real(self, joint, *args, **kwargs)
        self.backward = forward  # some other graph: its key cannot match the backward's
        return forward, backward

    monkeypatch.setattr(backend._Partition, "__call__", forward_as_backward)
    _trains_like_eager(steps=2)
    stats = kiln.stats()
    assert stats.get("backwards_ahead", 0) == 0
    assert {g.kind: g.level for g in session.compiled_graphs()} == {
        "forward": "heuristic", "backward": "heuristic"}


def test_no_backward_is_compiled_ahead_for_cpu_graphs_or_in_background_mode(monkeypatch) -> None:
    kiln.configure(url=None)
    train_mlp(steps=1)  # CPU graphs under the interpreter: not thread-safe, never ahead
    assert kiln.stats().get("backwards_ahead", 0) == 0 and not _aheads_waiting()
    monkeypatch.setattr(ahead, "ON_CPU", True)
    torch._dynamo.reset()
    kiln.degrade.reset()
    train_mlp(steps=1, options={"background": True})
    assert session.wait_compiled(60)
    assert kiln.stats().get("backwards_ahead", 0) == 0 and not _aheads_waiting()


def test_a_backward_that_cannot_be_converted_is_counted_eager_once(monkeypatch) -> None:
    from compiler.wire import graph as wire

    monkeypatch.setattr(ahead, "ON_CPU", True)
    real = wire.to_wire_and_graph

    def refuse_backwards(gm, inputs):
        if any(n.name.startswith("tangents") for n in gm.graph.nodes if n.op == "placeholder"):
            raise compiler.WireError("refused for the test")
        return real(gm, inputs)

    monkeypatch.setattr(wire, "to_wire_and_graph", refuse_backwards)
    _trains_like_eager(steps=2)
    stats = kiln.stats()
    assert stats["eager"] == 1 and stats["builds"] == 1
    assert stats.get("backwards_ahead", 0) == 0


def test_a_backward_whose_build_failed_ahead_is_not_built_again(monkeypatch, kiln_warnings) -> None:
    monkeypatch.setattr(ahead, "ON_CPU", True)
    real = resolve.Resolver._build
    tried = []

    def fail_backwards(self, entry, schedule):
        if entry.kind == "backward":
            tried.append(entry.key)
            raise RuntimeError("no kernels for the test")
        return real(self, entry, schedule)

    monkeypatch.setattr(resolve.Resolver, "_build", fail_backwards)
    _trains_like_eager(steps=2)
    stats = kiln.stats()
    assert len(tried) == 1  # built (and failed) once, ahead
    assert stats["backwards_ahead"] == 1 and stats["eager"] == 1 and stats["builds"] == 1
    assert {g.kind: g.level for g in session.compiled_graphs()} == {
        "forward": "heuristic", "backward": "eager"}


def test_looking_the_backend_up_warms_up_what_needs_no_device(monkeypatch) -> None:
    """On a GPU machine, `kiln.backend`'s import starts Triton's hash of itself in a child
    process, primes dynamo, builds the decomposition table and freezes the heap, before
    the model's first step needs them; the child's key is the one Triton computes here."""
    import triton.runtime.cache as cache

    from compiler.lowering import decomposition_table
    from compiler.runtime import execution, triton_key
    from kiln import preload

    # Not Triton's own setting: restoring it would leave it set for every later test.
    monkeypatch.setattr(execution, "runs_on_cpu", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(triton_key, "_known", False)
    monkeypatch.setattr(triton_key, "_child", None)
    monkeypatch.setattr(cache, "triton_key", cache.triton_key)  # restored after the test
    decomposition_table._table.cache_clear()
    primed = []
    monkeypatch.setattr(preload, "prime_dynamo", lambda: primed.append("dynamo"))
    monkeypatch.setattr(preload, "import_compiler", lambda: primed.append("compiler"))
    monkeypatch.setattr(preload, "freeze_heap", lambda: primed.append("heap"))
    monkeypatch.setattr(warmup.PROCESS, "warmed_up", False)  # each call below: a fresh process's
    warmup.warm_up_early()
    warmup.warm_up_early()  # once per process
    assert primed == ["dynamo", "compiler", "heap"]  # the first compile's imports, on this thread
    monkeypatch.setenv("KILN_GC_FREEZE", "0")
    monkeypatch.setattr(triton_key, "_child", None)
    monkeypatch.setattr(warmup.PROCESS, "warmed_up", False)
    warmup.warm_up_early()
    assert primed[3:] == ["dynamo", "compiler"]  # the collector left alone
    monkeypatch.setenv("KILN_GC_FREEZE", "sometimes")  # a bad value: the first compile names it
    monkeypatch.setattr(warmup.PROCESS, "warmed_up", False)
    warmup.warm_up_early()
    assert primed[5:] == ["dynamo", "compiler"]
    assert triton_key._child is not None  # started, not yet waited for
    assert decomposition_table._table.cache_info().currsize == 1  # built on this thread too
    real = cache.triton_key.__wrapped__()  # Triton's own function, uncached
    assert triton_key.ensure() == real
    assert not hasattr(cache.triton_key, "cache_info")  # the child's key, not a hash here
