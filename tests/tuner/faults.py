"""Fault hooks for runner tests. The runner's child calls the hook given at spawn time with
each candidate; production never passes one, and a request cannot name one."""

from __future__ import annotations

import os
import time

CRASH_XBLOCK = 999  # a config no search space produces: marks the candidate to kill the child
HANG_XBLOCK = 998
RAISE_XBLOCK = 997


def crash_or_hang(candidate: dict) -> None:
    xblock = candidate["config"].get("XBLOCK")
    if xblock == CRASH_XBLOCK:
        os._exit(3)  # what a segfaulting kernel looks like from the parent: the child is gone
    if xblock == HANG_XBLOCK:
        time.sleep(600)
    if xblock == RAISE_XBLOCK:
        raise RuntimeError("injected failure")
