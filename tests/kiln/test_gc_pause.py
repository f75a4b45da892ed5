"""The garbage collector is paused while kiln compiles (`kiln.gc_pause`): across the
compiles of overlapping threads, resumed by the last one, and never turned on by kiln
when the program had turned it off."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

import compiler
import kiln
from kiln.gc_pause import gc_paused
from tests.kiln.helpers import train_mlp

pytestmark = pytest.mark.usefixtures("kiln_state")


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_overlapping_compiles_resume_the_collector_when_the_last_one_ends() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def second() -> None:
        first_in.wait()
        with gc_paused():
            second_in.set()
            first_out.wait()
            seen.append(gc.isenabled())  # the first compile ended; this one still runs

    thread = threading.Thread(target=second)
    thread.start()
    with gc_paused():
        first_in.set()
        second_in.wait()
        assert not gc.isenabled()
    first_out.set()
    thread.join()
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_compile_that_raises_resumes_the_collector() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("lowering failed")
    assert gc.isenabled()


def test_the_backend_builds_graphs_with_the_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[bool] = []
    build = compiler.build

    def recording_build(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        states.append(gc.isenabled())
        return build(*args, **kwargs)

    monkeypatch.setattr(compiler, "build", recording_build)
    kiln.configure(url=None)
    train_mlp(steps=2)
    assert states and not any(states)  # forward and backward
    assert gc.isenabled()
