"""The import rules hold: import-linter's contracts pass, and what it cannot see: no import
circle in compiler/ counting function-level imports and lazy names, one module that builds
Triton's ASTSource and calls `triton.compile`, compiler.aot used by its public names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_linter_contracts_pass() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    assert lint_imports.exists(), f"lint-imports not installed next to {sys.executable}"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout, result.stdout[-4000:]


# ---- rules import-linter cannot see: function-level imports, lazy names, call sites ---------
SHIPPED = ["compiler", "tuner", "service", "kiln", "migrations", "bench", "scripts"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*packages: str) -> dict[str, tuple[Path, ast.Module]]:
    """{module name: (path, parsed source)} of every .py file under the packages."""
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = (path, ast.parse(path.read_text(), str(path)))
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of a module, function bodies included, but not under `if TYPE_CHECKING:`
    (imports for type checkers only, never executed)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        nodes.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def _lazy_names(tree: ast.Module) -> dict[str, str]:
    """A lazy package face's `_PUBLIC = {name: module}` (compiler/lazy.py), else {}."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_PUBLIC"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _import_graph(sources: dict[str, tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    """Module -> the modules it imports when it runs: imports inside functions count, a
    name imported from a lazy package face counts as its defining module, and so does
    `package.name` after `import package` / `from parent import package`."""
    lazy = {m: _lazy_names(tree) for m, (_, tree) in sources.items()}
    return {module: _imports(module, path, tree, set(sources), lazy) - {module}
            for module, (path, tree) in sources.items()}


def _imports(module: str, path: Path, tree: ast.Module, modules: set[str],
             lazy: dict[str, dict[str, str]]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges: set[str] = set()
    bound: dict[str, str] = {}  # local name -> the lazy package it names
    nodes = _runtime_nodes(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            named = [(a.name, a.asname or a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            named = []
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    named.append((f"{base}.{alias.name}", alias.asname or alias.name))
                elif alias.name in lazy.get(base, {}):
                    edges.add(lazy[base][alias.name])
                elif base in modules:
                    edges.add(base)
        else:
            continue
        for name, local in named:
            if name in modules:
                edges.add(name)
                if lazy.get(name):
                    bound[local] = name
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in bound:
            where = lazy[bound[node.value.id]].get(node.attr)
            if where is not None:
                edges.add(where)
    return edges


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: its strongly connected components of more than one
    module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_circles_through_lazy_names_and_function_imports() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    graph = _import_graph(_sources("compiler"))
    # A function-level import and a lazy name each make an edge.
    assert "compiler.runtime.triton_key" in graph["compiler.runtime.loading"]
    assert "compiler.aot.ahead" in graph["compiler.runtime.built"]  # `from compiler.aot import compile_ahead`
    assert "compiler.aot.launchers" in graph["compiler.runtime.static_launch"]  # `aot.per_kernel_launchers`


def test_no_import_circle_in_compiler() -> None:
    assert _circles(_import_graph(_sources("compiler"))) == []


def _compile_calls(tree: ast.Module) -> list[str]:
    """The `ASTSource(...)` and `triton.compile(...)` calls of a module."""
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "ASTSource" or \
                isinstance(func, ast.Attribute) and func.attr == "ASTSource":
            calls.append("ASTSource")
        elif isinstance(func, ast.Attribute) and func.attr == "compile" \
                and isinstance(func.value, ast.Name) and func.value.id == "triton":
            calls.append("triton.compile")
    return calls


def test_one_module_builds_astsources_and_calls_triton_compile() -> None:
    where: dict[str, set[str]] = {"ASTSource": set(), "triton.compile": set()}
    for module, (_, tree) in _sources(*SHIPPED, "tests").items():
        for call in _compile_calls(tree):
            where[call].add(module)
    assert where == {"ASTSource": {"compiler.aot.triton_compile"},
                     "triton.compile": {"compiler.aot.triton_compile"}}


def test_other_packages_use_compiler_aots_public_names_only() -> None:
    """Outside compiler/aot/ (tests aside, which test its modules), compiler.aot is used by
    its public names: `from compiler.aot import <public>` or `aot.<public>`."""
    import compiler.aot

    public = set(compiler.aot.__all__)
    wrong = []
    for module, (_, tree) in _sources(*SHIPPED).items():
        if module == "compiler.aot" or module.startswith("compiler.aot."):
            continue
        bound = set()
        for node in _runtime_nodes(tree):
            if isinstance(node, ast.Import):
                wrong += [f"{module}: import {a.name}" for a in node.names
                          if a.name.startswith("compiler.aot")]
            elif isinstance(node, ast.ImportFrom) and node.module == "compiler.aot":
                wrong += [f"{module}: from compiler.aot import {a.name}" for a in node.names
                          if a.name not in public]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("compiler.aot."):
                wrong.append(f"{module}: from {node.module} import ...")
            elif isinstance(node, ast.ImportFrom) and node.module == "compiler":
                bound |= {a.asname or a.name for a in node.names if a.name == "aot"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in bound and node.attr not in public:
                wrong.append(f"{module}: aot.{node.attr}")
    assert wrong == []
