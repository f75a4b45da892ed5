"""kiln's tuner: search spaces, isolated candidate runs, verification, search.

Public names load lazily so that `import tuner` stays cheap; the same names are imported
under TYPE_CHECKING for type checkers and readers (tests/test_package_faces.py keeps the two
lists equal).
"""

from typing import TYPE_CHECKING

from compiler.lazy import lazy_exports

if TYPE_CHECKING:
    from tuner.api import TuningResult as TuningResult
    from tuner.api import tune as tune
    from tuner.runner import Runner as Runner
    from tuner.search import Budget as Budget

_PUBLIC = {
    "tune": "tuner.api",
    "TuningResult": "tuner.api",
    "Budget": "tuner.search",
    "Runner": "tuner.runner",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_exports(globals(), _PUBLIC)
