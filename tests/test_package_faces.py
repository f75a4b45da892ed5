"""The lazy package faces of `compiler`, `compiler.aot` and `tuner`: the names a type checker
sees (imported under TYPE_CHECKING) are exactly the names that load lazily, each from the
same module, and importing any of them stays cheap."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["compiler", "compiler.aot", "tuner"]


def _type_checking_imports(package: str) -> dict[str, str]:
    """{name: module} of the `from M import N as N` statements under `if TYPE_CHECKING:`."""
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module, ast.dump(stmt)
                for alias in stmt.names:
                    # `N as N`: the explicit re-export form type checkers honour
                    assert alias.asname == alias.name, f"{package}: write {alias.name} as itself"
                    names[alias.name] = stmt.module
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_the_typed_names_are_the_lazy_names(package: str) -> None:
    module = importlib.import_module(package)
    assert _type_checking_imports(package) == module._PUBLIC
    assert sorted(module.__all__) == sorted(module._PUBLIC)


@pytest.mark.parametrize("package", PACKAGES)
def test_each_public_name_is_its_modules_object(package: str) -> None:
    module = importlib.import_module(package)
    for name, where in module._PUBLIC.items():
        assert getattr(module, name) is getattr(importlib.import_module(where), name), name


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_the_package_loads_neither_torch_nor_triton(package: str) -> None:
    code = (f"import sys, {package}; "
            "print([m for m in ('torch', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
