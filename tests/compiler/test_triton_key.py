"""Triton's key of itself from a child process (compiler/runtime/triton_key.py): the key the
child gives is Triton's own; a child that fails, is late or names another Triton leaves
the key to be computed here; two threads that need it at once compute it once."""

from __future__ import annotations

import functools
import threading
import time

import pytest
import triton.runtime.cache as cache

from compiler.runtime import triton_key


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key known, no child, and Triton's own function back after each test."""
    monkeypatch.setattr(triton_key, "_known", False)
    monkeypatch.setattr(triton_key, "_child", None)
    monkeypatch.setattr(cache, "triton_key", cache.triton_key)


def _counting(calls: list[int], value: str = "computed-here"):  # noqa: ANN202
    @functools.lru_cache
    def key() -> str:
        calls.append(1)
        time.sleep(0.2)
        return value

    return key


def test_the_childs_key_is_tritons_own_and_is_installed() -> None:
    real = cache.triton_key.__wrapped__()
    triton_key.start()
    assert triton_key._child is not None
    assert triton_key.ensure() == real
    assert cache.triton_key() == real
    assert not hasattr(cache.triton_key, "cache_info")  # the child's answer, not a hash here


def test_two_threads_that_need_the_key_at_once_compute_it_once(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(cache, "triton_key", _counting(calls))
    threads = [threading.Thread(target=triton_key.ensure) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]


def _exits(channel) -> None:  # noqa: ANN001 - child targets (compiler.child)
    raise SystemExit(3)


def _garbage(channel) -> None:  # noqa: ANN001
    channel.send("not a key")


def _another_triton(channel) -> None:  # noqa: ANN001 - its key must not stand for this one's
    import triton

    channel.send({"file": "/elsewhere/triton/__init__.py", "version": triton.__version__,
                  "key": triton.__version__ + "-other"})


def _late(channel) -> None:  # noqa: ANN001
    time.sleep(30)


@pytest.mark.parametrize("target", ["_exits", "_garbage", "_another_triton"])
def test_a_child_that_fails_or_names_another_triton_leaves_the_key_to_be_computed_here(
        monkeypatch, target: str) -> None:
    calls: list[int] = []
    monkeypatch.setattr(cache, "triton_key", _counting(calls))
    monkeypatch.setattr(triton_key, "TARGET", f"{__name__}:{target}")
    triton_key.start()
    assert triton_key.ensure() == "computed-here"
    assert calls == [1]


def test_a_late_child_is_killed_and_the_key_computed_here(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(cache, "triton_key", _counting(calls))
    monkeypatch.setattr(triton_key, "TARGET", f"{__name__}:_late")
    monkeypatch.setattr(triton_key, "CHILD_TIMEOUT_S", 0.5)
    triton_key.start()
    child = triton_key._child
    started = time.monotonic()
    assert triton_key.ensure() == "computed-here"
    assert time.monotonic() - started < 10
    assert child is not None and child.exitcode is not None  # killed, not left running
