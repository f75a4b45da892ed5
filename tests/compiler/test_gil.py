"""The short switch interval kiln holds while it does I/O beside threads running Python
(compiler/runtime/gil.py): counted across threads, restored by the last holder, never
longer than what it found."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from compiler.runtime import gil


def _about(seconds: float):
    return pytest.approx(seconds, rel=0.05)  # the interpreter keeps whole microseconds


@pytest.fixture(autouse=True)
def _default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_short_inside_and_restored_after() -> None:
    with gil.short_switch_interval():
        assert sys.getswitchinterval() == _about(gil.SHORT_SWITCH_INTERVAL)
        with gil.short_switch_interval():  # nested: still short, the outer one restores
            pass
        assert sys.getswitchinterval() == _about(gil.SHORT_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == _about(0.005)


def test_it_never_lengthens_an_interval_set_shorter() -> None:
    sys.setswitchinterval(0.0001)
    with gil.short_switch_interval():
        assert sys.getswitchinterval() == _about(0.0001)
    assert sys.getswitchinterval() == _about(0.0001)


def test_the_last_of_concurrent_holders_restores_it_whichever_leaves_first() -> None:
    entered, release_first, first_left = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first_holder() -> None:
        with gil.short_switch_interval():
            entered.set()
            release_first.wait(5)
        first_left.set()

    thread = threading.Thread(target=first_holder)
    thread.start()
    assert entered.wait(5)
    with gil.short_switch_interval():
        release_first.set()
        assert first_left.wait(5)
        seen["after the first left"] = sys.getswitchinterval()
    thread.join(5)
    assert seen["after the first left"] == _about(gil.SHORT_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == _about(0.005)


def test_a_child_forked_inside_gets_the_interval_back() -> None:
    read, write = os.pipe()
    with gil.short_switch_interval():
        pid = os.fork()
        if pid == 0:  # the child: its holders were the parent's threads
            os.write(write, repr(sys.getswitchinterval()).encode())
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        assert float(pipe.read()) == _about(0.005)
