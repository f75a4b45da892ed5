"""kiln's compiler: the kiln.graph/1 wire format, keys, lowering, fusion, Triton codegen.

Public names load lazily so that `import compiler` stays cheap (a service process that only
parses wire graphs never imports Triton).
"""

from compiler.lazy import lazy_exports

_PUBLIC = {
    # wire format and keys (compiler/wire.py, compiler/keys.py)
    "to_wire": "compiler.wire",
    "from_wire": "compiler.wire",
    "Graph": "compiler.wire",
    "WireError": "compiler.wire",
    "ValidationCancelled": "compiler.wire",
    "parse_json": "compiler.wire",
    "graph_hash": "compiler.keys",
    "Target": "compiler.keys",
    "tuning_key": "compiler.keys",
    "COMPILER_VERSION": "compiler.keys",
    "decompositions": "compiler.decomposition_table",
    "random_inputs": "compiler.inputs",
    # schedules, build and runtime (compiler/schedule.py, compiler/heuristics.py, compiler/runtime.py)
    "Schedule": "compiler.schedule",
    "KernelChoice": "compiler.schedule",
    "ScheduleMismatch": "compiler.schedule",
    "heuristic_schedule": "compiler.heuristics",
    "build": "compiler.runtime",
    "Built": "compiler.runtime",
    "runs_on_cpu": "compiler.execution",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_exports(globals(), _PUBLIC)
