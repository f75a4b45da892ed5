"""A kernel's JIT function from its generated source, which is checked against its sha256.

`import_kernel`: files under $KILN_KERNEL_DIR named by the sha256 of their source, imported
from there, so that a process only ever executes kernel code that it (or the process that
handed it the source) generated from a validated graph. `fresh_function`: a new module made
from the source in memory, with the interpreter off, for a process compiling for a GPU it
does not have (nothing is read back from $KILN_KERNEL_DIR there).

Torch-free: the compile workers (`compiler/aot/worker.py`) import this and Triton only,
and start in well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import linecache
import os
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any


def kernel_dir() -> Path:
    """Where generated kernel modules live ($KILN_KERNEL_DIR or ~/.cache/kiln/kernels)."""
    return Path(os.environ.get("KILN_KERNEL_DIR") or Path.home() / ".cache" / "kiln" / "kernels")


def source_hash(source: str) -> str:
    """sha256 of a kernel's generated source."""
    return hashlib.sha256(source.encode()).hexdigest()


def import_kernel(source: str, digest: str) -> ModuleType:
    """Write `source` to its content-addressed file (again when the file there differs)
    and import a new module from it. Raises ValueError when `digest` is not its hash."""
    if source_hash(source) != digest:
        raise ValueError(f"kernel source does not match its sha256 {digest[:12]}")
    directory = kernel_dir() / digest[:2]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"kiln_{digest}.py"
    if not path.exists() or source_hash(path.read_text()) != digest:
        tmp = directory / f".{digest}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"kiln_kernel_{digest}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import generated kernel {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fresh_function(kernel: str, source: str, digest: str, fn_name: str) -> Any:
    """Function `fn_name` of a new module made from a kernel's source, checked against its
    sha256 `digest` (ValueError otherwise) and executed with the interpreter off, so that
    it is a JIT function that compiles for a GPU (its @triton.jit helpers too); `inspect`,
    hence Triton, finds its source in `linecache`."""
    if source_hash(source) != digest:
        raise ValueError(f"kernel {kernel}: source does not match its sha256")
    filename = f"<kiln-aot kiln_{digest}.py>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(f"kiln_aot_{digest}")
    module.__file__ = filename
    with interpreter_off():
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - hash-checked
    return getattr(module, fn_name)


@contextmanager
def interpreter_off() -> Iterator[None]:
    """TRITON_INTERPRET=0 for the duration: Triton reads it while decorating and compiling,
    and under the interpreter its compile path does not lower for a real GPU."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
