"""kiln client: `torch.compile(model, backend="kiln")` with schedules tuned by the service.

`import kiln` stays light (no torch, no compiler) until the backend is first used:
`kiln.remote_compile` (`kiln.backend`) and `kiln.wait_compiled` (`kiln.session`) load on
access.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from kiln import logs
from kiln.config import Config, configure
from kiln.degrade import KilnWarning, stats, timeline
from kiln.report import report

__all__ = ["Config", "KilnWarning", "configure", "remote_compile", "report", "stats",
           "timeline", "wait_compiled"]

_LAZY = {"remote_compile": "kiln.backend", "wait_compiled": "kiln.session"}

logs.apply()  # KILN_LOG_LEVEL, and kiln's lines shown without a logging setup


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
