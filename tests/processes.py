"""Processes a test started and left running: each child a test starts gets a marker in
its environment, which every process it starts in turn inherits (multiprocessing's spawned
children and resource tracker included), so those left behind are found by it in /proc
after the test, wherever they were reparented."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

MARK = "KILN_TEST_PROCESS_MARK"  # the variable; its value is one per test


def new_mark() -> dict[str, str]:
    """An environment entry to add to a child's environment."""
    return {MARK: uuid.uuid4().hex}


def marked(mark: dict[str, str]) -> dict[int, str]:
    """The running processes that carry `mark`, by id, with their command lines (zombies,
    which hold no memory and are reaped by their parent, are not counted)."""
    needle = f"{MARK}={mark[MARK]}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ") \
                .decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def end_left_behind(mark: dict[str, str]) -> dict[int, str]:
    """Kill the processes that carry `mark` (what a failing test left) and return them."""
    left = marked(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left
