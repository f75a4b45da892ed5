"""Processes a test started and left running: each child a test starts gets a marker in
its environment, which every process it starts in turn inherits (spawned children and
those forked from kiln's fork servers included), so those left behind are found by it in /proc
after the test, wherever they were reparented."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

MARK = "KILN_TEST_PROCESS_MARK"  # the variable; its value is one per test


def new_mark() -> dict[str, str]:
    """An environment entry to add to a child's environment."""
    return {MARK: uuid.uuid4().hex}


def ended(pid: int) -> bool:
    """Whether process `pid` is gone or a zombie (finished, waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


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
            if ended(int(proc.name)):
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


# ---- the whole run: what the test session leaves behind (tests/conftest.py) -----------------
SESSION_GRACE_S = 5.0  # how long processes ending as the session ends are given to go

# Children of the test process itself that end with it (they read a pipe from it), by the
# code they were started with: Python's multiprocessing resource tracker, and kiln's fork
# servers, compile workers and Triton key child (`compiler.child` targets, named on their
# command lines).
_ENDS_WITH_PARENT = ("multiprocessing.resource_tracker", "compiler.child:_serve_forks",
                     "compiler.aot.worker:serve", "compiler.runtime.triton_key:_compute")


def _ends_with_this_process(pid: int, cmdline: str) -> bool:
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return parent == os.getpid() and any(h in cmdline for h in _ENDS_WITH_PARENT)


def left_behind(mark: dict[str, str], grace: float = SESSION_GRACE_S) -> dict[int, str]:
    """The processes carrying `mark` still running after up to `grace` seconds (polled: a
    child that is ending as the session ends is not counted), other than this process's
    own helpers, which end with it."""
    deadline = time.monotonic() + grace
    while True:
        left = {pid: cmd for pid, cmd in marked(mark).items()
                if not _ends_with_this_process(pid, cmd)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
