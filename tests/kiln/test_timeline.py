"""`kiln.timeline()`: the compile steps one by one, per thread, on one clock; what the
model suite records to attribute a first step's time."""

from __future__ import annotations

import threading
import time

import pytest

import compiler
import kiln
from kiln import degrade
from tests.kiln.fake_http import FakeServer, json_reply
from tests.kiln.helpers import train_mlp

pytestmark = pytest.mark.usefixtures("kiln_state")


def test_a_step_is_placed_where_it_ran_on_its_thread() -> None:
    degrade.reset()
    before = degrade.clock()
    time.sleep(0.01)
    degrade.add_seconds("build", 0.01)

    def other() -> None:
        degrade.add_seconds("precompile", 0.002)

    thread = threading.Thread(target=other, name="kiln-backward-ahead")
    thread.start()
    thread.join()
    steps = kiln.timeline()
    assert [(s["step"], s["thread"]) for s in steps] == [
        ("build", threading.current_thread().name), ("precompile", "kiln-backward-ahead")]
    assert before - 0.001 <= steps[0]["start"] <= degrade.clock()
    assert kiln.stats()["seconds:build"] == pytest.approx(0.01)
    degrade.reset()
    assert kiln.timeline() == []


def test_training_locally_times_each_graph_inside_its_aot_trace() -> None:
    kiln.configure(url=None)
    degrade.reset()
    train_mlp(steps=1)
    steps = kiln.timeline()
    names = [s["step"] for s in steps]
    assert names.count("wire") == 2 and names.count("build") == 2 and "aot" in names
    aot = next(s for s in steps if s["step"] == "aot")
    forward_wire = next(s for s in steps if s["step"] == "wire")
    assert aot["start"] <= forward_wire["start"]
    assert forward_wire["start"] + forward_wire["seconds"] <= aot["start"] + aot["seconds"] + 1e-3


def test_a_graph_is_lowered_while_the_service_is_asked_for_its_schedule() -> None:
    """The exchange waits on the network; lowering, which every schedule's build starts
    from, runs meanwhile on the graph's own thread."""
    answered: list[float] = []

    def slow_failed(method, path, body):
        time.sleep(0.4)
        key = compiler.tuning_key(compiler.from_wire(body["graph"]),
                                  compiler.Target.from_json(body["target"]))
        answered.append(degrade.clock())
        return json_reply(202, {"key": key, "status": "failed", "job_id": 3, "schedule": None})

    with FakeServer(slow_failed) as srv:
        kiln.configure(url=srv.url, poll_interval=0.05)
        degrade.reset()
        with pytest.warns(kiln.KilnWarning):  # "rejected": then built here
            train_mlp(steps=1)
    lowered = [s for s in kiln.timeline() if s["step"] == "lower"]
    assert len(lowered) == 2 and len(answered) == 2  # forward, backward
    for step, done in zip(lowered, answered, strict=True):
        assert step["thread"] == threading.current_thread().name  # CPU: no backward thread
        assert step["start"] + step["seconds"] < done  # over before the answer came
    assert kiln.stats()["schedules_local"] == 2


def test_each_builds_first_call_is_a_timeline_step_and_later_calls_are_not() -> None:
    kiln.configure(url=None)
    degrade.reset()
    train_mlp(steps=3)
    steps = kiln.timeline()
    first_calls = [s for s in steps if s["step"] == "first_call"]
    assert len(first_calls) == 2  # forward, backward: once each over three steps
    builds = [s for s in steps if s["step"] == "build"]
    assert all(c["start"] >= b["start"] + b["seconds"] - 1e-3 for c, b in zip(first_calls, builds, strict=True))
    assert kiln.stats()["seconds:first_call"] == pytest.approx(sum(c["seconds"] for c in first_calls),
                                                              abs=1e-3)
