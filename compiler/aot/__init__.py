"""Ahead-of-time compile of Triton kernels, and their binaries in Triton's cache.

Modules, each one job (other packages import the names below, never the modules):
- `triton_compile`: the one place kiln builds an `ASTSource` and calls `triton.compile`;
  the Triton cache key of a compile.
- `specialize`: what Triton's JIT would compile for a launch, captured without compiling,
  also for a GPU that is not here (`StandInDriver`).
- `jobs`: a compile job (a kernel's source and one launch's specialisation).
- `sources`: a kernel's JIT function from its hash-checked generated source.
- `launchers`: Triton's per-signature C launchers, built ahead.
- `worker`, `pool`: the compile worker processes and the pool of them.
- `binaries`: binaries in Triton's cache (read, check, install, take back).
- `ahead`: compile a graph's jobs ahead (cached, from a binary source, or in the pool).
- `target`: compile a built graph's launches for a CUDA GPU this machine does not have.

Public names load lazily, so that a compile worker, which imports `compiler.aot.worker`,
loads neither torch nor anything it does not use; the same names are imported under
TYPE_CHECKING for type checkers and readers (tests/test_package_faces.py keeps the two
lists equal).
"""

from typing import TYPE_CHECKING

from compiler.lazy import lazy_exports

if TYPE_CHECKING:
    from compiler.aot.ahead import BinarySource as BinarySource
    from compiler.aot.ahead import CompileCrash as CompileCrash
    from compiler.aot.ahead import binary_source as binary_source
    from compiler.aot.ahead import compile_ahead as compile_ahead
    from compiler.aot.binaries import binary_files as binary_files
    from compiler.aot.binaries import check_binary_files as check_binary_files
    from compiler.aot.binaries import forget_binaries as forget_binaries
    from compiler.aot.binaries import install_binary as install_binary
    from compiler.aot.binaries import is_cached as is_cached
    from compiler.aot.jobs import CompileJob as CompileJob
    from compiler.aot.jobs import job_key as job_key
    from compiler.aot.launchers import per_kernel_launchers as per_kernel_launchers
    from compiler.aot.pool import start as start
    from compiler.aot.sources import import_kernel as import_kernel
    from compiler.aot.sources import source_hash as source_hash
    from compiler.aot.specialize import StandInDriver as StandInDriver
    from compiler.aot.specialize import specialization as specialization
    from compiler.aot.target import AotUnavailable as AotUnavailable
    from compiler.aot.target import LaunchSpec as LaunchSpec
    from compiler.aot.target import compile_for_target as compile_for_target
    from compiler.aot.target import cuda_arch as cuda_arch
    from compiler.aot.target import launch_specs as launch_specs
    from compiler.aot.triton_compile import backend_hash as backend_hash

_PUBLIC = {
    # compiling a graph's kernels ahead, on this machine (the client)
    "CompileJob": "compiler.aot.jobs",
    "job_key": "compiler.aot.jobs",
    "specialization": "compiler.aot.specialize",
    "compile_ahead": "compiler.aot.ahead",
    "CompileCrash": "compiler.aot.ahead",
    "BinarySource": "compiler.aot.ahead",
    "binary_source": "compiler.aot.ahead",
    "start": "compiler.aot.pool",
    "per_kernel_launchers": "compiler.aot.launchers",
    "backend_hash": "compiler.aot.triton_compile",
    "import_kernel": "compiler.aot.sources",
    "source_hash": "compiler.aot.sources",
    # binaries in Triton's cache
    "binary_files": "compiler.aot.binaries",
    "check_binary_files": "compiler.aot.binaries",
    "install_binary": "compiler.aot.binaries",
    "is_cached": "compiler.aot.binaries",
    "forget_binaries": "compiler.aot.binaries",
    # compiling for a GPU this machine does not have (service, tuner)
    "StandInDriver": "compiler.aot.specialize",
    "AotUnavailable": "compiler.aot.target",
    "LaunchSpec": "compiler.aot.target",
    "launch_specs": "compiler.aot.target",
    "cuda_arch": "compiler.aot.target",
    "compile_for_target": "compiler.aot.target",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_exports(globals(), _PUBLIC)
