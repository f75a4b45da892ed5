"""The interpreter's thread switch interval, held short while a thread does I/O beside
threads that run Python.

A thread that releases the GIL for a system call (a socket receive, a file read) waits up to
the switch interval (`sys.getswitchinterval()`, 5 ms by default) to take it back whenever
another thread is running Python. kiln's compiling threads run Python for most of a first
step (lowering, building) while other threads fetch plans, schedules and binaries from the
service, install binaries and load kernels: each receive, each chunk, pays that wait.
Measured on this project's CI machine (`python -m bench.exchange_beside_python`: one
`kiln.client` exchange with a local server beside two threads running Python, median of
10): a 2 KB answer took 47.9 ms at the default interval (0.9 ms alone), 300 KB 136 ms, 3 MB
1.18 s; with a 0.2 ms interval 2.8, 10.6 and 64 ms. Two threads running Python lost nothing
measurable to the shorter interval (1.74 s at 5 ms, 1.77 s at 0.2 ms, same work).

`short_switch_interval()` holds the process-wide interval at most SHORT_SWITCH_INTERVAL while
any thread is inside it (nested and concurrent holders are counted) and restores the value
it found when the last one leaves; it never lengthens the interval. Torch-free.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SHORT_SWITCH_INTERVAL = 0.0002  # s

_lock = threading.Lock()
_holders = 0
_restore_to = 0.0  # the interval found when the first holder entered


@contextmanager
def short_switch_interval() -> Iterator[None]:
    """The switch interval at most SHORT_SWITCH_INTERVAL for the block (see the module)."""
    global _holders, _restore_to
    with _lock:
        if _holders == 0:
            _restore_to = sys.getswitchinterval()
            sys.setswitchinterval(min(_restore_to, SHORT_SWITCH_INTERVAL))
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                sys.setswitchinterval(_restore_to)


def _forget_after_fork() -> None:
    global _holders, _lock
    if _holders:  # the holders are threads of the parent: the child gets its interval back
        sys.setswitchinterval(_restore_to)
    _holders, _lock = 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
