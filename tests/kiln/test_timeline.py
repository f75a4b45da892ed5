"""`kiln.timeline()`: the compile steps one by one, per thread, on one clock; what the
model suite records to attribute a first step's time."""

from __future__ import annotations

import threading
import time

import pytest

import kiln
from kiln import degrade
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
