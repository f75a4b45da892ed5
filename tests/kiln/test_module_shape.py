"""The client's shape (issue 32): `kiln/backend.py` is the dynamo/AOTAutograd adapter alone,
short and without state of its own; what a configuration keeps lives in its session
(`kiln/session.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

import kiln.backend

BACKEND = Path(kiln.backend.__file__)
MAX_LINES = 300


def _module_bindings(tree: ast.Module) -> list[tuple[str, int]]:
    """Each name the module's own statements bind, with its line (imports, definitions,
    assignments, loops, `with ... as`), in order."""
    bound: list[tuple[str, int]] = []

    def targets(node: ast.AST) -> None:
        for name in ast.walk(node):
            if isinstance(name, ast.Name):
                bound.append((name.id, name.lineno))

    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            for alias in stmt.names:
                bound.append(((alias.asname or alias.name).split(".")[0], stmt.lineno))
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.append((stmt.name, stmt.lineno))
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                targets(target)
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
            targets(stmt.target)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                if item.optional_vars is not None:
                    targets(item.optional_vars)
    return bound


def test_the_backend_module_is_short() -> None:
    lines = BACKEND.read_text().count("\n")
    assert lines <= MAX_LINES, f"kiln/backend.py has {lines} lines (at most {MAX_LINES})"


def test_the_backend_module_rebinds_no_global() -> None:
    tree = ast.parse(BACKEND.read_text(), str(BACKEND))
    declared = [(node.lineno, node.names) for node in ast.walk(tree)
                if isinstance(node, ast.Global | ast.Nonlocal)]
    assert not declared, f"global/nonlocal statements in kiln/backend.py: {declared}"
    seen: dict[str, int] = {}
    for name, line in _module_bindings(tree):
        assert name not in seen, (f"kiln/backend.py binds {name!r} at module level twice "
                                  f"(lines {seen[name]} and {line})")
        seen[name] = line
    augmented = [stmt.lineno for stmt in tree.body if isinstance(stmt, ast.AugAssign)]
    assert not augmented, f"module-level augmented assignments at lines {augmented}"


def test_the_backend_module_keeps_no_mutable_state() -> None:
    """Its module-level values are constants and its logger: no registry, list or lock
    (a configuration's state is its session's)."""
    tree = ast.parse(BACKEND.read_text(), str(BACKEND))
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
            continue
        value = stmt.value
        is_logger = (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                     and value.func.attr == "getLogger")
        assert isinstance(value, ast.Constant) or is_logger, (
            f"kiln/backend.py line {stmt.lineno}: module-level {ast.unparse(value)}")


def test_the_checks_above_see_a_rebinding() -> None:
    """The checks fail on what they forbid."""
    tree = ast.parse("import a\nx = 1\ndef f():\n    global x\n    x = 2\nx = 3\n")
    names = [name for name, _ in _module_bindings(tree)]
    assert names == ["a", "x", "f", "x"]
    assert any(isinstance(node, ast.Global) for node in ast.walk(tree))
