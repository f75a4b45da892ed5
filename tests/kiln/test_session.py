"""Sessions (kiln/session.py): one per configuration, each with its own resolver, poller,
background compiler, plans and backwards ahead; the poller is a thread that runs what it
is handed."""

from __future__ import annotations

import threading
import time

import pytest

from kiln import session
from kiln.compiled import CompiledGraph
from kiln.config import Config
from kiln.poller import Poller
from kiln.resolve import PollState
from tests.kiln.helpers import causes, train_mlp

pytestmark = pytest.mark.usefixtures("kiln_state")


def test_one_session_per_configuration_each_with_its_own_parts() -> None:
    first = session.for_config(Config(url=None))
    assert session.for_config(Config(url=None)) is first
    other = session.for_config(Config(url=None, mode="async"))
    assert other is not first
    assert set(session.sessions()) == {first, other}
    for part in ("resolver", "poller", "compiler", "plans", "aheads"):
        assert getattr(first, part) is not getattr(other, part)
    assert first.plans.resolver is first.resolver and first.aheads.resolver is first.resolver
    assert first.resolver.watch == first.poller.watch


def test_a_session_for_an_unusable_url_has_no_service(kiln_warnings) -> None:
    current = session.for_config(Config(url="ftp://example.invalid"))
    assert current.config.url is None and current.resolver.client is None
    assert session.for_config(Config(url="ftp://example.invalid")) is current
    assert causes(kiln_warnings) == {"config": 1}


def test_shutdown_forgets_the_sessions_and_their_graphs() -> None:
    import kiln

    kiln.configure(url=None)
    train_mlp(steps=1)
    assert sorted(g.kind for g in session.compiled_graphs()) == ["backward", "forward"]
    (current,) = session.sessions()
    session.shutdown()
    assert session.sessions() == [] and session.compiled_graphs() == []
    assert session.for_config(current.config) is not current


def test_the_poller_runs_each_graphs_rounds_until_one_says_done() -> None:
    import torch

    poller = Poller(interval=0.01, give_up_after=60)
    rounds: list[str] = []
    done = threading.Event()

    def poll_round(entry: CompiledGraph, state: PollState) -> bool:
        rounds.append(threading.current_thread().name)
        if len(rounds) == 3:
            done.set()
            return True
        return False

    entry = CompiledGraph(torch.fx.symbolic_trace(torch.nn.Identity()))
    try:
        poller.watch(entry, PollState(), poll_round)
        assert done.wait(10)
        deadline = time.monotonic() + 10
        while poller.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller.pending() == 0 and rounds == ["kiln-poller"] * 3
    finally:
        poller.stop()
    poller.watch(entry, PollState(), poll_round)  # stopped: nothing more is watched
    assert poller.pending() == 0
