"""Triton's C launchers, built ahead: Triton 3.6 builds one per kernel signature (its NVIDIA
driver's `make_launcher`, compiled with the system's C compiler into Triton's cache) on the
thread that loads a kernel; the compile workers build them instead. Triton 3.9 launches
every kernel through one launcher and builds none. Torch-free."""

from __future__ import annotations

from typing import Any


def per_kernel_launchers() -> bool:
    """Whether this Triton builds a C launcher per kernel signature when it loads a CUDA
    kernel: Triton 3.6 does, on the loading thread, one compiler run per signature its cache
    lacks; Triton 3.9 launches every kernel through one launcher."""
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return False
    return callable(getattr(nvidia, "make_launcher", None))


def build_launcher(kernel: Any) -> None:
    """Build the C launcher of a compiled kernel (a `triton.compile` result) into Triton's
    cache where this Triton builds one per signature (`per_kernel_launchers`), with the
    call its loading thread makes (`CompiledKernel._init_handles`:
    `launcher_cls(src, metadata)`), so that the load finds it there; nothing otherwise."""
    target = getattr(getattr(kernel, "metadata", None), "target", None)
    if getattr(target, "backend", None) != "cuda" or not per_kernel_launchers():
        return
    from triton.backends.nvidia.driver import CudaLauncher

    CudaLauncher(kernel.src, kernel.metadata)
