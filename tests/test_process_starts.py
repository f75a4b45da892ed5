"""Every process kiln starts goes through one primitive (compiler/child.py): it bounds the
messages, holds the deadline and the memory cap, and kills the child's whole process group.
This scans kiln's packages (ast) for the other ways to start a process and allows them only
there.

Running an external tool to completion (`subprocess.run` with a timeout, as
`tuner.aot.resource_usage` runs cuobjdump) is not starting a child of kiln's and is not
counted."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compiler", "kiln", "service", "tuner")
ALLOWED = {"compiler/child.py"}
# module -> names in it that start a process
STARTERS = {
    "subprocess": {"Popen"},
    "os": {"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen", "spawnl",
           "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
           "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe"},
    "multiprocessing": {"Process", "Pool", "get_context", "Pipe", "set_start_method"},
    "concurrent.futures": {"ProcessPoolExecutor"},
    "concurrent.futures.process": {"ProcessPoolExecutor"},
    "torch.multiprocessing": {"Process", "Pool", "spawn", "start_processes", "get_context"},
}
# Importing these modules at all is a way to start processes.
MODULES = {"multiprocessing", "torch.multiprocessing", "concurrent.futures.process"}


def _starts(tree: ast.AST) -> list[str]:
    """What in `tree` starts a process: `module.name` for a call or reference through an
    imported module, or an import of a starter (or a starting module)."""
    aliases: dict[str, str] = {}  # local name -> module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[(alias.asname or alias.name).split(".")[0]] = \
                    alias.name if alias.asname else alias.name.split(".")[0]
                if alias.name in MODULES or alias.name.startswith("multiprocessing."):
                    found.append(f"import {alias.name} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in MODULES or node.module.startswith("multiprocessing"):
                found.append(f"from {node.module} import ... (line {node.lineno})")
            for alias in node.names:
                if alias.name in STARTERS.get(node.module, ()):
                    found.append(f"{node.module}.{alias.name} (line {node.lineno})")
                full = f"{node.module}.{alias.name}"
                if full in MODULES or full in STARTERS:
                    aliases[alias.asname or alias.name] = full
        elif isinstance(node, ast.Attribute):
            module = _dotted(node.value, aliases)
            if module is not None and node.attr in STARTERS.get(module, ()):
                found.append(f"{module}.{node.attr} (line {node.lineno})")
    return found


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The module an expression such as `os` or `concurrent.futures` names, if any."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return None if base is None else f"{base}.{node.attr}"
    return None


def test_the_scan_finds_each_way_to_start_a_process() -> None:
    code = """
import subprocess, os
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from os import posix_spawn
import concurrent.futures
subprocess.Popen(["true"])
os.fork()
mp.get_context("spawn")
concurrent.futures.ProcessPoolExecutor()
subprocess.run(["true"], timeout=5)  # a tool run to completion: not counted
"""
    found = _starts(ast.parse(code))
    assert [f.split(" (")[0] for f in found] == [
        "import multiprocessing", "concurrent.futures.ProcessPoolExecutor", "os.posix_spawn",
        "subprocess.Popen", "os.fork", "multiprocessing.get_context",
        "concurrent.futures.ProcessPoolExecutor"], found


def test_processes_are_started_only_by_compiler_child() -> None:
    offenders = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in ALLOWED:
                continue
            found = _starts(ast.parse(path.read_text(), filename=relative))
            if found:
                offenders[relative] = found
    assert not offenders, ("start child processes through compiler.child (spawn or "
                           f"ForkServer), not directly: {offenders}")


def test_the_allowed_files_exist() -> None:
    assert all((ROOT / path).is_file() for path in ALLOWED)
