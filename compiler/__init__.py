"""kiln's compiler: the kiln.graph/1 wire format, keys, lowering, fusion, Triton codegen.

Public names load lazily so that `import compiler` stays cheap (a service process that only
parses wire graphs never imports Triton).
"""

from compiler.lazy import lazy_exports

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
