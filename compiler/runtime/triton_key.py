"""Triton's cache key of itself (`triton.runtime.cache.triton_key`), computed in a child
process so that the process that loads kernels never hashes Triton in its own interpreter.

`triton_key()` hashes Triton's Python sources and its ~500 MB library and, on the way,
imports every package under `triton.compiler` and `triton.backends` (`pkgutil.walk_packages`):
0.5-1 s of work, part of every kernel's cache key. Done on a thread of a process whose
main thread is tracing a model, it holds the GIL and the import locks often enough to slow
dynamo's tracing by more than it costs itself (measured on this project's CI machine:
resnet18's trace 1.08 s alone, 1.42-1.86 s beside the hash). A child (`start`, spawned
through `compiler.child` with a deadline of `CHILD_TIMEOUT_S`) computes it on another core
instead; `ensure` takes its answer and makes Triton use it, as Triton's own
compile-warmup workers do (`triton._compile_warmup_pool` sets `triton.runtime.cache.triton_key`
to a function returning the parent's key). The child's key is taken only when it names the
same Triton package (path and version) as this process; otherwise, or when the child fails
or is late, the key is computed here as before. Torch-free, like the compile workers.
"""

from __future__ import annotations

import logging
import os
import threading

from compiler.child import Channel, Child, ChildError, spawn
from compiler.runtime.gil import short_switch_interval

log = logging.getLogger(__name__)

CHILD_TIMEOUT_S = 60.0  # a child slower than this is killed and the key computed here
TARGET = "compiler.runtime.triton_key:_compute"  # what the child runs

_lock = threading.Lock()
_child: Child | None = None
_known = False  # Triton's key is cached in this process (computed here or installed)


def start() -> None:
    """Start the child that computes the key (at most once, and not once it is known);
    returns at once. A child that cannot be started leaves the key to `ensure`."""
    global _child
    with _lock:
        if _known or _child is not None:
            return
        try:
            # The key does not depend on the interpreter setting; the child only imports Triton.
            _child = spawn(TARGET, name="Triton key", env={"TRITON_INTERPRET": None},
                           deadline_s=CHILD_TIMEOUT_S)
        except ChildError as exc:
            log.debug("no child for Triton's key: %s", exc)


def ensure() -> str:
    """Triton's key, cached for the process: the child's answer (waited for; the wait
    releases the GIL) when it is valid, else computed here. Threads that ask while it is
    being obtained wait for the first one."""
    global _child, _known
    from triton.runtime import cache

    with _lock:
        if not _known:
            child, _child = _child, None
            key = _answer(child) if child is not None else None
            if key is not None:
                cache.triton_key = _returning(key)
            else:
                # Computed here, the hash reads the library in 1 MB chunks beside the tracing
                # thread: 7.7 s instead of 0.5 s on the CI machine, 0.9 s with a short interval.
                with short_switch_interval():
                    cache.triton_key()
            _known = True
    return cache.triton_key()


def _compute(channel: Channel) -> None:
    """In the child: which Triton, and its key."""
    import triton
    from triton.runtime.cache import triton_key

    channel.send({"file": triton.__file__, "version": triton.__version__, "key": triton_key()})


def _answer(child: Child) -> str | None:
    """The key the child computed, if it is one for this process's Triton; None otherwise."""
    import triton

    try:
        found = child.recv()  # within the child's deadline, past which it is killed
    except (ChildError, ValueError) as exc:
        log.debug("no key from the child computing Triton's key: %s", exc)
        return None
    finally:
        child.close()
    key = found.get("key") if isinstance(found, dict) else None
    if (not isinstance(key, str) or found.get("file") != triton.__file__
            or found.get("version") != triton.__version__ or not key.startswith(triton.__version__)):
        log.debug("the child computed Triton's key for another Triton; computing it here")
        return None
    return key


def _returning(key: str):  # noqa: ANN202 - stands in for Triton's own zero-argument function
    def triton_key() -> str:
        return key

    return triton_key


def _forget_after_fork() -> None:
    global _child, _lock
    _child, _lock = None, threading.Lock()  # the child belongs to the parent


os.register_at_fork(after_in_child=_forget_after_fork)
