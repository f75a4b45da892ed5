"""The client's first compile (issue 14, cold compile time): each graph is converted and
validated once (the key still the one `from_wire` of its wire gives, which the service
computes), and the compile workers and Triton's loader are prepared once per process."""

from __future__ import annotations

import threading

import pytest
import torch

import compiler
import kiln
from compiler.runtime import compile_pool
from compiler.wire import graph as wire_graph
from kiln import backend
from tests.kiln.helpers import train_mlp

pytestmark = pytest.mark.usefixtures("kiln_state")


def test_each_graph_is_validated_once_and_keyed_as_from_wire_keys_its_wire(monkeypatch) -> None:
    runs = []
    infer = wire_graph.infer_meta
    monkeypatch.setattr(wire_graph, "infer_meta", lambda *a, **k: runs.append(1) or infer(*a, **k))
    kiln.configure(url=None)
    train_mlp(steps=2)
    graphs = backend.compiled_graphs()
    assert sorted(g.kind for g in graphs) == ["backward", "forward"]
    assert len(runs) == 2  # one meta run per graph (to_wire + from_wire ran two each)
    for g in graphs:
        assert g.key == compiler.tuning_key(compiler.from_wire(g.wire), g.target)
        assert g.wire == compiler.to_wire(g.gm, list(g.graph.inputs))


def test_workers_start_and_the_loader_is_prepared_once_per_process(monkeypatch) -> None:
    started, prepared = [], threading.Event()
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(compile_pool, "start", lambda: started.append(1))

    def prepare() -> None:
        calls.append(threading.current_thread().name)
        prepared.set()

    monkeypatch.setattr(compile_pool, "prepare_loading", prepare)
    monkeypatch.setattr(backend, "_preparing", None)
    backend._start_compile_workers()
    backend._start_compile_workers()
    assert prepared.wait(10)
    backend._preparing.join(10)
    assert started == [1, 1]  # the pool's own start is idempotent
    assert calls == ["kiln-prepare"]  # off the tracing thread, once
    assert "seconds:prepare" in kiln.stats()


def test_a_loader_that_cannot_be_prepared_costs_nothing_but_the_try(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(compile_pool, "start", lambda: None)

    def fail() -> None:
        raise RuntimeError("0 active drivers")

    monkeypatch.setattr(compile_pool, "prepare_loading", fail)
    monkeypatch.setattr(backend, "_preparing", None)
    backend._start_compile_workers()
    backend._preparing.join(10)
    assert not backend._preparing.is_alive()
