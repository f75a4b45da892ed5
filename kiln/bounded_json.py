"""JSON from outside the process (a service answer, a file of the local cache) decoded with
bounds, so that no document can raise out of `torch.compile` or take the job's memory.

`json.loads` alone recurses once per nesting level: 100 KB of `[` raised RecursionError
through the backend and the training job exited 1. Here a document is refused (`Refused`,
a ValueError) when it is larger than its cap, holds more containers than `max_containers`
(counted before parsing: a 32 MiB answer of `[],` would build ten million lists), nests
deeper than `max_depth`, or is not UTF-8 JSON. Callers turn `Refused` into their degrade
path: a malformed answer, a cache miss.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32  # a schedule, a job or a binaries answer nests 5 levels
MAX_CONTAINERS = 1 << 20  # objects and arrays together: tens of MB of Python objects at most


class Refused(ValueError):
    """A document outside the bounds, or not JSON; the message says which."""


def loads(raw: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH,
          max_containers: int = MAX_CONTAINERS) -> Any:
    """Decode `raw` within the bounds; `Refused` otherwise."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if len(data) > max_bytes:
        raise Refused(f"{len(data)} bytes, more than the limit of {max_bytes}")
    # An upper bound (a bracket inside a string counts too), in C and before any is built.
    containers = data.count(b"[") + data.count(b"{")
    if containers > max_containers:
        raise Refused(f"up to {containers} objects and arrays, more than {max_containers}")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except RecursionError:
        raise Refused("nested too deeply to decode") from None
    except (ValueError, MemoryError) as exc:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise Refused(f"not JSON: {str(exc)[:120]}") from None
    depth = nesting(doc, max_depth)
    if depth > max_depth:
        raise Refused(f"nested more than {max_depth} levels")
    return doc


def nesting(doc: Any, stop_past: int) -> int:
    """How deep `doc`'s containers nest (a scalar: 0), found without recursion; the walk
    stops as soon as it passes `stop_past`."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(doc, 1)]
    while todo:
        value, depth = todo.pop()
        if type(value) is dict:
            children = value.values()
        elif type(value) is list:
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_past:
            break
        todo.extend((child, depth + 1) for child in children
                    if type(child) is dict or type(child) is list)
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"bare {name} is not JSON")
