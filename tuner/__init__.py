"""kiln's tuner: search spaces, isolated candidate runs, verification, search, benchmarks.

Public names load lazily so that `import tuner` stays cheap.
"""

from importlib import import_module
from typing import Any

_PUBLIC = {
    "tune": "tuner.api",
    "TuningResult": "tuner.api",
    "Budget": "tuner.search",
    "Runner": "tuner.runner",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
