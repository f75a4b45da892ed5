"""KILN_BACKGROUND=1: kiln's part of compiling runs off the training thread; the first
steps run eagerly and the builds are installed between calls once they are ready."""

from __future__ import annotations

import threading

import pytest

import compiler
import kiln
from kiln import config as kiln_config
from kiln import session
from tests.kiln.helpers import (
    assert_close_losses,
    causes,
    check_grads_per_batch,
    train_gpt,
    train_mlp,
)

pytestmark = pytest.mark.usefixtures("kiln_state")


def _levels() -> dict[str, str]:
    return {g.kind: g.level for g in session.compiled_graphs()}


def test_the_first_steps_do_not_wait_for_the_build(monkeypatch, kiln_warnings):
    """With the build held back, training runs (eagerly, correctly); once released, the
    graphs are built on the background thread and installed."""
    kiln.configure(url=None, background=True)
    release = threading.Event()
    builder_threads: list[str] = []
    real_build = compiler.build

    def held_build(graph, schedule=None, example_inputs=None):
        builder_threads.append(threading.current_thread().name)
        assert release.wait(60), "the test never released the build"
        return real_build(graph, schedule, example_inputs)

    monkeypatch.setattr(compiler, "build", held_build)
    want = train_mlp(steps=3, backend=None)
    assert_close_losses(train_mlp(steps=3), want)  # finished while the build was held
    assert _levels() == {"forward": "eager", "backward": "eager"}
    assert not kiln.wait_compiled(0)

    release.set()
    assert kiln.wait_compiled(120)
    assert _levels() == {"forward": "heuristic", "backward": "heuristic"}
    assert set(builder_threads) == {"kiln-compile"}
    stats = kiln.stats()
    assert stats["builds"] == 2 and stats["eager"] == 0 and stats["seconds:background"] > 0
    assert not causes(kiln_warnings)


def test_training_through_the_swap_matches_eager(kiln_warnings):
    """The tiny GPT: steps before and after the builds land all match eager."""
    kiln.configure(url=None, background=True)
    want = train_gpt(steps=5, backend=None)
    got = train_gpt(steps=5)
    assert kiln.wait_compiled(120)
    assert_close_losses(got, want)
    assert set(_levels().values()) == {"heuristic"}
    # A later run of the same model goes through the installed builds.
    assert_close_losses(train_gpt(steps=2), want[:2])
    assert not causes(kiln_warnings)


def test_a_failing_background_build_leaves_the_graph_eager_with_one_warning(
        monkeypatch, kiln_warnings):
    kiln.configure(url=None, background=True)

    def broken_build(*args, **kwargs):
        raise RuntimeError("no kernels today")

    monkeypatch.setattr(compiler, "build", broken_build)
    want = train_mlp(steps=3, backend=None)
    got = train_mlp(steps=3)
    assert kiln.wait_compiled(120)
    assert_close_losses(got, want)
    assert _levels() == {"forward": "eager", "backward": "eager"}
    assert causes(kiln_warnings) == {"build_failed": 1}
    assert kiln.stats()["eager"] == 2


def test_wait_compiled_returns_at_once_without_background_work():
    assert kiln.wait_compiled(0)


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), ("0", False),
                                                 ("", False), ("off", False)])
def test_kiln_background_is_read_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("KILN_BACKGROUND", value)
    assert kiln_config.current().background is expected


def test_a_bad_kiln_background_value_is_named(monkeypatch):
    monkeypatch.setenv("KILN_BACKGROUND", "sometimes")
    with pytest.raises(ValueError, match="KILN_BACKGROUND='sometimes'"):
        kiln_config.current()


def test_dynamic_shapes_compile_per_shape_in_the_background(kiln_warnings):
    """Per-shape specialising (make_fx, on the training thread) and background builds of
    earlier shapes run side by side; every gradient matches eager."""
    import torch

    from examples.models import SeedMLP

    kiln.configure(url=None, background=True)
    torch.manual_seed(0)
    model = SeedMLP(16, 32, 10)
    compiled = torch.compile(model, backend="kiln", dynamic=True)
    check_grads_per_batch(compiled, model, (3, 5, 3, 5))
    assert kiln.wait_compiled(120)
    assert causes(kiln_warnings) == {"dynamic_shapes": 1}
    stats = kiln.stats()
    assert stats["schedules_local"] == 4 and stats["builds"] == 4 and stats["eager"] == 0, stats
