"""Targets for tests/compiler/test_child.py, run in child processes (`compiler.child`)."""

from __future__ import annotations

import os
import subprocess
import time

from compiler.child import Channel


def echo(channel: Channel) -> None:
    """Send back every message, JSON as JSON and bytes as bytes, until the channel ends."""
    while True:
        if channel.poll(None) and _echo_one(channel) is None:
            return


def _echo_one(channel: Channel) -> bool | None:
    try:
        value = channel.recv()
    except EOFError:
        return None
    if value == "bytes":
        channel.send_bytes(channel.recv_bytes())
    else:
        channel.send(value)
    return True


def sleep(channel: Channel, seconds: float) -> None:
    channel.send("sleeping")
    time.sleep(seconds)


def allocate(channel: Channel, nbytes: int) -> None:
    """Allocate `nbytes` and say whether it worked."""
    try:
        block = bytearray(nbytes)
    except MemoryError:
        channel.send({"error": "MemoryError"})
        return
    channel.send({"ok": len(block)})


def exit_with(channel: Channel, code: int) -> None:
    os._exit(code)


def send_bytes(channel: Channel, size: int) -> None:
    """Send `size` bytes, past the limit both sides were given (a child gone wrong)."""
    channel.max_message = size
    channel.send_bytes(b"x" * size)
    channel.recv()  # wait for the parent


def with_grandchild(channel: Channel) -> None:
    """Start a process of its own (in the child's process group), say its id, then wait."""
    grandchild = subprocess.Popen(["sleep", "300"])
    channel.send(grandchild.pid)
    grandchild.wait()


def niceness(channel: Channel) -> None:
    channel.send(os.nice(0))


_warmed = False  # set in the fork server by `warm_up`, inherited by its children


def warm_up() -> None:
    global _warmed
    _warmed = True


def warmed(channel: Channel) -> None:
    channel.send(_warmed)
