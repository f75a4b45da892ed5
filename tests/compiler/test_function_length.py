"""No function in compiler/ is longer than about a screen (issue 12): a long function there
has always meant several ideas interleaved (the old reduction `generate`, `_pointwise`)."""

from __future__ import annotations

import ast
from pathlib import Path

COMPILER = Path(__file__).resolve().parents[2] / "compiler"
LIMIT = 80


def test_no_function_in_compiler_is_longer_than_the_limit() -> None:
    long = []
    for path in sorted(COMPILER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.relative_to(COMPILER.parent)}:{node.lineno} "
                                f"{node.name} ({lines} lines)")
    assert not long, "split these: " + "; ".join(long)
