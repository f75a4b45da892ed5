"""Generated kernel modules on disk: files under $KILN_KERNEL_DIR named by the sha256 of
their source, imported from there, so that a process only ever executes kernel code that
it (or the process that handed it the source) generated from a validated graph.

Torch-free: the compile workers (`compiler/runtime/compile_pool.py`) import this and Triton only,
and start in well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from pathlib import Path
from types import ModuleType


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
