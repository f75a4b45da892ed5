"""The child-process primitive (compiler/child.py), spawned and forked from a warm server:
messages both ways, the deadline kills, the memory cap makes an allocation fail in the
child, an oversized message is refused, a dead child is reported with its status, and a
closed child leaves no process behind (its own children included)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compiler import child
from compiler.child import ChildDied, ChildTimeout, Limits, MessageTooLarge

TARGETS = "tests.compiler.child_targets"
MB = 1 << 20

Start = Callable[..., child.Child]


@pytest.fixture(scope="module")
def server() -> Iterator[child.ForkServer]:
    fork_server = child.ForkServer([f"{TARGETS}:warm_up"], name="test fork server")
    yield fork_server
    fork_server.close()


@pytest.fixture(params=["spawn", "fork"])
def start(request: pytest.FixtureRequest, server: child.ForkServer) -> Start:
    def started(function: str, args: list[Any] = (), **kw: Any) -> child.Child:
        target = f"{TARGETS}:{function}"
        if request.param == "spawn":
            return child.spawn(target, args, **kw)
        return server.start(target, args, **kw)

    return started


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_json_and_bytes_go_both_ways(start: Start) -> None:
    with start("echo", name="echo") as proc:
        proc.send({"numbers": [1, 2.5], "text": "é"})
        assert proc.recv(30) == {"numbers": [1, 2.5], "text": "é"}
        proc.send("bytes")
        proc.send_bytes(bytes(range(256)) * 1000)
        assert proc.recv_bytes(30) == bytes(range(256)) * 1000
    assert proc.exitcode is not None


def test_the_deadline_kills_the_child(start: Start) -> None:
    proc = start("sleep", [300], name="sleeper", deadline_s=1.0)
    try:
        assert proc.recv() == "sleeping"
        started = time.monotonic()
        with pytest.raises(ChildTimeout, match="the sleeper process gave no answer"):
            proc.recv()  # no timeout of its own: the deadline bounds it
        assert time.monotonic() - started < 5
        assert proc.wait(10) == -9
    finally:
        proc.close()


def test_a_timeout_of_one_wait_kills_the_child(start: Start) -> None:
    proc = start("sleep", [300], name="sleeper")
    try:
        proc.recv(60)
        with pytest.raises(ChildTimeout):
            proc.recv(0.2)
        assert proc.wait(10) == -9
    finally:
        proc.close()


def test_the_memory_cap_makes_an_allocation_fail_in_the_child(start: Start) -> None:
    # The cap is above what the child holds already (a forked child shares the server's
    # imports), so small allocations still work and a large one fails.
    cap = Limits(memory_bytes=1024 * MB)
    with start("allocate", [16 * MB], name="allocator", limits=cap) as proc:
        assert proc.recv(60) == {"ok": 16 * MB}
    with start("allocate", [2048 * MB], name="allocator", limits=cap) as proc:
        assert proc.recv(60) == {"error": "MemoryError"}
    with start("allocate", [2048 * MB], name="allocator",
               limits=Limits(memory_bytes=1024 * MB, address_space=True)) as proc:
        assert proc.recv(60) == {"error": "MemoryError"}


def test_an_oversized_message_is_refused_both_ways(start: Start) -> None:
    small = Limits(max_message=1000)
    with start("echo", name="echo", limits=small) as proc:
        with pytest.raises(MessageTooLarge, match="over the limit of 1000"):
            proc.send_bytes(b"x" * 1001)
        proc.send("fits")
        assert proc.recv(30) == "fits"  # a refused send left the channel usable
    proc = start("send_bytes", [5000], name="sender", limits=small)
    try:
        with pytest.raises(MessageTooLarge, match="announced a message of 5000 bytes"):
            proc.recv_bytes(30)
        assert proc.wait(10) == -9  # a child that breaks the protocol is killed
    finally:
        proc.close()


def test_a_dead_child_is_reported_with_its_status(start: Start) -> None:
    proc = start("exit_with", [3], name="doomed")
    try:
        with pytest.raises(ChildDied, match="the doomed process exited with status 3") as died:
            proc.recv(30)
        assert died.value.exitcode == 3
    finally:
        proc.close()
    proc = start("sleep", [300], name="victim")
    try:
        proc.recv(60)
        os.kill(proc.pid, 9)
        with pytest.raises(ChildDied, match="killed by signal 9"):
            proc.recv(30)
    finally:
        proc.close()


def test_close_leaves_no_process_behind(start: Start) -> None:
    proc = start("with_grandchild", name="parent of one")
    grandchild = proc.recv(60)
    assert _running(proc.pid) and _running(grandchild)
    proc.close()
    deadline = time.monotonic() + 10
    while _running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(proc.pid) and not _running(grandchild)


def test_the_child_runs_niced(start: Start) -> None:
    with start("niceness", name="nice", limits=Limits(nice=5)) as proc:
        assert proc.recv(60) == os.nice(0) + 5


def test_a_forked_child_inherits_the_servers_warm_up(server: child.ForkServer) -> None:
    with server.start(f"{TARGETS}:warmed", name="warmed") as proc:
        assert proc.recv(60) is True
    with child.spawn(f"{TARGETS}:warmed", name="cold") as proc:
        assert proc.recv(60) is False


def test_a_closed_server_ends_its_children_and_a_new_one_starts() -> None:
    fork_server = child.ForkServer([], name="short-lived server")
    try:
        first = fork_server.warm()
        proc = fork_server.start(f"{TARGETS}:sleep", [300], name="orphan")
        proc.recv(60)
        fork_server.close()
        assert proc.wait(10) is not None and not _running(proc.pid) and not _running(first)
        proc.close()
        assert fork_server.warm() != first
    finally:
        fork_server.close()
