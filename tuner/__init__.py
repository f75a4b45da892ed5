"""kiln's tuner: search spaces, isolated candidate runs, verification, search.

Public names load lazily so that `import tuner` stays cheap.
"""

from compiler.lazy import lazy_exports

_PUBLIC = {
    "tune": "tuner.api",
    "TuningResult": "tuner.api",
    "Budget": "tuner.search",
    "Runner": "tuner.runner",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_exports(globals(), _PUBLIC)
