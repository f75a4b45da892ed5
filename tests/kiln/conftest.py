"""Fixtures for the client tests: a clean kiln state per test, and a warning record."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import kiln
from kiln import config as kiln_config
from kiln import degrade, session


@pytest.fixture
def kiln_state(tmp_path, monkeypatch) -> Iterator[dict]:
    """Fresh client state: no KILN_* from outside, an empty cache dir, dynamo reset,
    counters and warnings forgotten, the poller stopped afterwards."""
    for var in list(kiln_config._ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "schedules"))
    kiln.configure(reset=True)
    degrade.reset()
    session.shutdown()
    torch._dynamo.reset()
    yield {"cache_dir": tmp_path / "schedules"}
    session.shutdown()
    kiln.configure(reset=True)
    degrade.reset()
    torch._dynamo.reset()


@pytest.fixture
def kiln_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning emitted during the test, from any thread (filter 'always', so a
    second warning of one cause would show); `helpers.causes()` counts kiln's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
