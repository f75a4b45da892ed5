"""A bounded, thread-safe memo of what ops give on the meta device, and the hashable
stand-in for an op's plain arguments that its keys are made of.

Validation (`compiler/wire/fx.py`) and lowering (`compiler/lowering/meta_memo.py`) run
every node of a graph on the meta device, and a model's layers repeat the same ops on the
same shapes: each keeps what an op gave for its op, argument metadata and other
arguments, for the whole process, and runs each such key once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

_ATOMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)

# The longest list a key or a remembered result may hold: an entry stays small (a
# service's memo serves every client; a `cat` of a thousand inputs is run, not kept).
MAX_LIST = 16


def plain_value(value: object, other: Callable[[object], object] | None = None) -> object:
    """A hashable stand-in for an argument, faithful to everything an op may read from it:
    its type (1, 1.0 and True differ), a float's sign and bits (-0.0 and 0.0 differ), each
    item of a list of at most `MAX_LIST`. `other` keys what is none of those (a tensor, an
    fx node; it raises TypeError for what it cannot key); without it, or for anything else,
    TypeError."""
    if isinstance(value, float):
        return ("float", value.hex())
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    if isinstance(value, _ATOMS):
        return value
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_LIST:
            raise TypeError(f"a list of {len(value)} is too long to keep")
        return (type(value).__name__, tuple(plain_value(v, other) for v in value))
    if isinstance(value, slice):
        return ("slice", plain_value(value.start), plain_value(value.stop), plain_value(value.step))
    if other is not None:
        return other(value)
    raise TypeError(f"no key for {type(value).__name__}")


class Memo:
    """Values by key, the least recently used dropped past `max_entries`."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, object] = OrderedDict()

    def get(self, key: Hashable | None) -> object | None:
        if key is None:
            return None
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: Hashable | None, value: object) -> None:
        if key is None:
            return
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
