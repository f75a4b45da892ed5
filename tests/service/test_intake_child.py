"""The intake's child process (`service.intake_child`): a body is decoded and validated
there, within a memory cap and a wall-time budget, and the child dies with its request."""

from __future__ import annotations

import json
import threading

import pytest

import compiler
from service.errors import ApiError
from service.intake_child import IntakeChild
from tests.service.helpers import wire_body

MB = 1 << 20
NUMBERS = b"[" + b"1," * (8 * MB - 2) + b"1]"  # 16 MiB: one array of 8M numbers
SMALL_LISTS = (b'{"graph":{"format":"kiln.graph/1","inputs":[],"outputs":[],"nodes":['
               + b"[[],[]]," * (2 * MB) + b'[]]},"target":{}}')  # 16 MiB of tiny arrays


def _ask(child: IntakeChild, body: bytes) -> ApiError:
    try:
        with pytest.raises(ApiError) as caught:
            child.submission(body)
    finally:
        child.close()
    return caught.value


def test_a_valid_submission_is_named_then_validated() -> None:
    body = json.dumps(wire_body()).encode()
    child = IntakeChild(2048 * MB, 30)
    try:
        sub = child.submission(body)
        child.finish(validate=True)
    finally:
        child.close()
    graph = compiler.from_wire(json.dumps(wire_body()["graph"]))
    assert sub["graph_hash"] == compiler.graph_hash(graph) and sub["num_nodes"] == len(graph.nodes)


def test_junk_is_refused_with_the_decoders_error() -> None:
    error = _ask(IntakeChild(2048 * MB, 30), NUMBERS)
    assert (error.status, error.code) == (422, "invalid_request")


def test_a_body_past_the_memory_cap_is_413() -> None:
    # ~320 MB of the data segment are the fork server's (torch); the lists need more than 80.
    error = _ask(IntakeChild(400 * MB, 30), SMALL_LISTS)
    assert (error.status, error.code) == (413, "too_large")
    assert "KILN_INTAKE_MEMORY_MB" in error.message


def test_a_body_past_the_budget_is_killed() -> None:
    child = IntakeChild(2048 * MB, 0.05)
    error = _ask(child, NUMBERS)
    assert (error.status, error.code) == (422, "intake_budget")
    assert child._proc.exitcode is not None  # killed, not left running


def test_cancel_stops_the_child_at_once() -> None:
    child = IntakeChild(2048 * MB, 30)
    threading.Timer(0.05, child.cancel).start()
    error = _ask(child, SMALL_LISTS)
    assert (error.status, error.code) == (400, "cancelled")


def test_the_child_reads_the_apis_limits_as_they_are_now(monkeypatch: pytest.MonkeyPatch) -> None:
    body = json.dumps(wire_body()).encode()
    IntakeChild(2048 * MB, 30).close()  # the fork server runs with the environment of before
    monkeypatch.setenv("KILN_MAX_NODES", "2")
    error = _ask(IntakeChild(2048 * MB, 30), body)
    assert error.status == 422 and "> limit 2" in error.message
