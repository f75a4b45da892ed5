"""kiln client: `torch.compile(model, backend="kiln")` with schedules tuned by the service.

`import kiln` stays light (no torch, no compiler) until the backend is first used:
`kiln.remote_compile` loads on access.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from kiln.config import Config, configure
from kiln.degrade import KilnWarning, stats

__all__ = ["Config", "KilnWarning", "configure", "remote_compile", "stats"]


def __getattr__(name: str) -> Any:
    if name == "remote_compile":
        value = import_module("kiln.backend").remote_compile
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
