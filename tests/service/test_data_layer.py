"""The service's SQL lives in service/store/ (issue 12): no other service module builds a
query or a write, and no other module puts a job on the queue."""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
# The data layer itself, and the engine, model and migration plumbing it stands on.
ALLOWED = {"store", "db.py", "models.py", "migrate.py"}
# What builds statements: SQLAlchemy's constructors and the ORM's query entry points.
BUILDERS = {"select", "insert", "update", "delete", "text", "func", "exists", "or_", "and_"}
QUERY_METHODS = {"execute", "scalars", "scalar", "get", "merge", "query", "exec_driver_sql"}


def _outside_store() -> list[Path]:
    return [p for p in SERVICE.rglob("*.py")
            if p.relative_to(SERVICE).parts[0] not in ALLOWED]


def test_no_service_module_outside_the_store_builds_sql() -> None:
    found = []
    for path in _outside_store():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
                found += [f"{path}: imports {a.name}" for a in node.names if a.name in BUILDERS]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in QUERY_METHODS and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in ("session", "conn"):
                found.append(f"{path}:{node.lineno}: {node.func.value.id}.{node.func.attr}()")
    assert not found, "SQL outside service/store/:\n" + "\n".join(found)


def test_only_the_after_commit_hook_enqueues() -> None:
    """`queue.enqueue` is called in one place: the context's after-commit hook, which runs
    what store.enqueue_after_commit registered (and marks needs_enqueue on failure)."""
    calls = []
    for path in SERVICE.rglob("*.py"):
        if path.relative_to(SERVICE).parts[0] == "queue":
            continue  # the queue implementations themselves
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "enqueue":
                calls.append(f"{path.relative_to(SERVICE)}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("context.py:"), calls
