"""kiln's compiler: the kiln.graph/1 wire format, keys, lowering, fusion, Triton codegen.

Public names load lazily so that `import compiler` stays cheap (a service process that only
parses wire graphs never imports Triton). The same names are imported under TYPE_CHECKING,
so type checkers and readers can follow `compiler.X` to its definition;
tests/test_package_faces.py keeps the two lists equal.
"""

from typing import TYPE_CHECKING

from compiler.lazy import lazy_exports

if TYPE_CHECKING:
    from compiler.lowering.decomposition_table import decompositions as decompositions
    from compiler.lowering.frontend import lower_graph as lower_graph
    from compiler.runtime.built import Built as Built
    from compiler.runtime.built import build as build
    from compiler.runtime.execution import runs_on_cpu as runs_on_cpu
    from compiler.scheduling.heuristics import heuristic_schedule as heuristic_schedule
    from compiler.scheduling.schedule import KernelChoice as KernelChoice
    from compiler.scheduling.schedule import Schedule as Schedule
    from compiler.scheduling.schedule import ScheduleMismatch as ScheduleMismatch
    from compiler.wire.graph import Graph as Graph
    from compiler.wire.graph import ValidationCancelled as ValidationCancelled
    from compiler.wire.graph import WireError as WireError
    from compiler.wire.graph import from_wire as from_wire
    from compiler.wire.graph import parse_json as parse_json
    from compiler.wire.graph import to_wire as to_wire
    from compiler.wire.inputs import random_inputs as random_inputs
    from compiler.wire.keys import COMPILER_VERSION as COMPILER_VERSION
    from compiler.wire.keys import Target as Target
    from compiler.wire.keys import graph_hash as graph_hash
    from compiler.wire.keys import tuning_key as tuning_key

_PUBLIC = {
    # wire format and keys (compiler/wire/)
    "to_wire": "compiler.wire.graph",
    "from_wire": "compiler.wire.graph",
    "Graph": "compiler.wire.graph",
    "WireError": "compiler.wire.graph",
    "ValidationCancelled": "compiler.wire.graph",
    "parse_json": "compiler.wire.graph",
    "graph_hash": "compiler.wire.keys",
    "Target": "compiler.wire.keys",
    "tuning_key": "compiler.wire.keys",
    "COMPILER_VERSION": "compiler.wire.keys",
    "decompositions": "compiler.lowering.decomposition_table",
    "lower_graph": "compiler.lowering.frontend",
    "random_inputs": "compiler.wire.inputs",
    # schedules (compiler/scheduling/), build and runtime (compiler/runtime/)
    "Schedule": "compiler.scheduling.schedule",
    "KernelChoice": "compiler.scheduling.schedule",
    "ScheduleMismatch": "compiler.scheduling.schedule",
    "heuristic_schedule": "compiler.scheduling.heuristics",
    "build": "compiler.runtime.built",
    "Built": "compiler.runtime.built",
    "runs_on_cpu": "compiler.runtime.execution",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_exports(globals(), _PUBLIC)
