"""Launch Triton 3.6 kernels through torch's static CUDA launcher: no C compiler per kernel.

Triton 3.6 loads a CUDA kernel with a launcher of its own per kernel signature
(`CudaLauncher`: C source generated for the signature and built with the system's C
compiler, ~0.3-1 s each on a machine whose Triton cache lacks it). That is most of what
loading a graph's binaries costs on a fresh machine, even when every binary came from the
service. PyTorch ships one launcher for every Triton kernel, already compiled into torch
(`torch._C._StaticCudaLauncher`, what Inductor launches its own kernels with): it takes the
kernel's CUfunction, launch size and a string of argument types.

`load(kernel)` loads a `CompiledKernel` as Triton does (`_init_handles`: module, function,
resource checks, load hooks), with a `StaticLauncher` in place of the C launcher when the
kernel is one it launches exactly as Triton would (`refusal` says why not otherwise: tensor
descriptors, tuple arguments, half-precision scalars, scratch memory, clusters, cooperative
or programmatic launches). A `StaticLauncher` is called the way Triton calls its own
(`CudaLauncher.__call__`: grid, stream, function, packed metadata, launch metadata and hooks,
then every kernel argument, constexprs included), so Triton's JIT and kiln's generated graph
launchers (compiler/runtime/launcher.py) launch it unchanged.

Used only where it pays and exists: Triton builds per-signature launchers
(`compile_pool.per_kernel_launchers`; Triton 3.9 has one launcher for every kernel) and this
torch has the static launcher (CUDA builds). `KILN_STATIC_LAUNCH=off` keeps Triton's own.
"""

from __future__ import annotations

import os
import threading
from typing import Any

ENV = "KILN_STATIC_LAUNCH"

# Triton signature type -> the static launcher's argument type code (Python's
# PyArg_ParseTuple letters, as torch's launcher reads them). Pointers are "O".
_SCALARS = {
    "i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l",
    "u1": "I", "u8": "B", "u16": "H", "u32": "I", "u64": "K",
    "fp32": "f", "f32": "f", "fp64": "d",
}

_swap_lock = threading.Lock()


def available() -> bool:
    """Whether kernels load with a `StaticLauncher`: a Triton with per-signature C
    launchers, a torch with the static launcher, and $KILN_STATIC_LAUNCH not "off"."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return False
    from compiler.runtime.compile_pool import per_kernel_launchers

    if not per_kernel_launchers():
        return False
    import torch

    return hasattr(torch._C, "_StaticCudaLauncher")


def argument_plan(signature: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
    """For a kernel's signature (argument name -> Triton type, in argument order): the
    static launcher's type string and the positions of the arguments the kernel takes
    (constexprs are passed to a launcher but not to the kernel). Raises ValueError for a
    type the static launcher does not pass as Triton's launcher would."""
    codes, keep = [], []
    for i, ty in enumerate(signature.values()):
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            raise ValueError(f"tuple argument {ty}")
        if ty.startswith("*"):
            codes.append("O")
        elif ty in _SCALARS:
            codes.append(_SCALARS[ty])
        else:  # fp16/bf16 scalars are packed by Triton's launcher; descriptors are objects
            raise ValueError(f"argument type {ty}")
        keep.append(i)
    # Triton 3.6 kernels take two more pointers: global and profile scratch (null here).
    return "".join(codes) + "OO", tuple(keep)


def refusal(src: Any, metadata: Any) -> str | None:
    """Why a compiled kernel (its ASTSource and metadata) must keep Triton's launcher, or
    None when a `StaticLauncher` launches it as that launcher would."""
    if not isinstance(getattr(src, "signature", None), dict):
        return "no signature"
    try:
        argument_plan(src.signature)
    except ValueError as exc:
        return str(exc)
    if getattr(metadata, "tensordesc_meta", None):
        return "tensor descriptors"
    for field in ("global_scratch_size", "profile_scratch_size"):
        if getattr(metadata, field, 0):
            return field.replace("_", " ")
    if getattr(metadata, "num_ctas", 1) != 1:
        return "a cluster launch"
    if getattr(metadata, "launch_cooperative_grid", False) or getattr(metadata, "launch_pdl", False):
        return "a cooperative or programmatic launch"
    return None


class StaticLauncher:
    """Triton 3.6's launcher protocol over torch's `_StaticCudaLauncher._launch_kernel`."""

    def __init__(self, src: Any, metadata: Any) -> None:
        import torch

        self.arg_tys, self.keep = argument_plan(src.signature)
        self.num_warps = metadata.num_warps
        self.shared = metadata.shared
        self._launch = torch._C._StaticCudaLauncher._launch_kernel

    def __call__(self, grid_x: int, grid_y: int, grid_z: int, stream: int, function: int,
                 packed_metadata: Any, launch_metadata: Any, enter_hook: Any, exit_hook: Any,
                 *args: Any) -> None:
        if enter_hook is not None:
            enter_hook(launch_metadata)
        if grid_x * grid_y * grid_z > 0:  # Triton's launcher launches no empty grid either
            self._launch(function, grid_x, grid_y, grid_z, self.num_warps, self.shared,
                         self.arg_tys, (*[args[i] for i in self.keep], None, None), stream)
        if exit_hook is not None:
            exit_hook(launch_metadata)


def load(kernel: Any) -> None:
    """Load a `CompiledKernel` (module, function, checks) so that it launches with a
    `StaticLauncher` where `available` and the kernel allows (`refusal`), and with
    Triton's own launcher otherwise; a kernel loaded already is left as it is."""
    init = getattr(kernel, "_init_handles", None)
    if init is None or getattr(kernel, "module", None) is not None:
        return
    if not available() or refusal(kernel.src, kernel.metadata) is not None:
        init()
        return
    from triton.runtime.driver import driver

    active = driver.active
    with _swap_lock:
        # Triton makes the launcher inside `_init_handles` from the driver's class; for the
        # call, that class is one that makes ours (it makes Triton's for any other kernel a
        # thread loads meanwhile: `refusal` decides per kernel).
        original = active.launcher_cls

        def make(src: Any, metadata: Any) -> Any:
            if refusal(src, metadata) is None:
                return StaticLauncher(src, metadata)
            return original(src, metadata)

        active.launcher_cls = make
        try:
            init()
        finally:
            active.launcher_cls = original
