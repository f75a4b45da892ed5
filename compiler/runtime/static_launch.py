"""Launch Triton 3.6 kernels through torch's static CUDA launcher: no C compiler per kernel.

Triton 3.6 loads a CUDA kernel with a launcher of its own per kernel signature
(`CudaLauncher`: C source generated for the signature and built with the system's C
compiler, ~0.3-1 s each on a machine whose Triton cache lacks it). That is most of what
loading a graph's binaries costs on a fresh machine, even when every binary came from the
service. PyTorch ships one launcher for every Triton kernel, already compiled into torch
(`torch._C._StaticCudaLauncher`, what Inductor launches its own kernels with): it takes the
kernel's CUfunction, launch size and a string of argument types.

`load(kernel)` loads a `CompiledKernel`'s cubin with torch's launcher and gives it a
`StaticLauncher` in place of the C launcher when the kernel is one it launches exactly as
Triton would (`refusal` says why not otherwise: tensor descriptors, tuple arguments,
half-precision scalars, scratch memory, clusters, cooperative or programmatic launches);
Triton loads the others. Triton's CUDA driver also builds a C module of utilities (its
binary loader among them) when it is made; `lazy_driver` defers that to its first use,
which kernels `load` loads never make. A `StaticLauncher` is called the way Triton calls its own
(`CudaLauncher.__call__`: grid, stream, function, packed metadata, launch metadata and hooks,
then every kernel argument, constexprs included), so Triton's JIT and kiln's generated graph
launchers (compiler/runtime/launcher.py) launch it unchanged.

Used only where it pays and exists: Triton builds per-signature launchers
(`compiler.aot.per_kernel_launchers`; Triton 3.9 has one launcher for every kernel) and this
torch has the static launcher (CUDA builds). `KILN_STATIC_LAUNCH=off` keeps Triton's own.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from compiler import aot

log = logging.getLogger(__name__)

ENV = "KILN_STATIC_LAUNCH"

# Triton signature type -> the static launcher's argument type code (Python's
# PyArg_ParseTuple letters, as torch's launcher reads them). Pointers are "O".
_SCALARS = {
    "i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l",
    "u1": "I", "u8": "B", "u16": "H", "u32": "I", "u64": "K",
    "fp32": "f", "f32": "f", "fp64": "d",
}

_driver_lock = threading.Lock()


def available() -> bool:
    """Whether kernels load with a `StaticLauncher`: a Triton with per-signature C
    launchers, a torch with the static launcher, and $KILN_STATIC_LAUNCH not "off"."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return False
    if not aot.per_kernel_launchers():
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
    """Load a `CompiledKernel` so that it launches with a `StaticLauncher` where `available`
    and the kernel allows (`refusal`): its cubin loaded by torch's static launcher, what
    Triton's `_init_handles` sets filled in (module, function, registers, spills, launcher),
    so that neither Triton's launcher nor its driver's C utility module is built. Otherwise,
    or with a Triton kernel-load hook set (a profiler), Triton loads it. A kernel loaded
    already is left as it is."""
    init = getattr(kernel, "_init_handles", None)
    if init is None or getattr(kernel, "module", None) is not None:
        return
    if not available() or refusal(kernel.src, kernel.metadata) is not None or _load_hooked():
        init()
        return
    import torch

    device = torch.cuda.current_device()
    cubin = kernel.metadata_group.get(f"{kernel.name}.cubin")
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
    if cubin is None or kernel.metadata.shared > limit:
        init()  # Triton's load raises its own error for a kernel that does not fit
        return
    try:
        loaded = torch._C._StaticCudaLauncher._load_kernel(cubin, kernel.name,
                                                          kernel.metadata.shared, device)
    except Exception as exc:  # noqa: BLE001 - a cubin torch cannot load: Triton's load says why
        log.debug("static launcher: %s did not load (%s: %s); Triton loads it", kernel.name,
                  type(exc).__name__, exc)
        init()
        return
    # torch 2.11 returns (module, function, registers, spills); older ones lack the module
    module, function, n_regs, n_spills = loaded if len(loaded) == 4 else (loaded[0], *loaded)
    kernel.n_regs, kernel.n_spills = n_regs, n_spills
    kernel.n_max_threads = kernel.metadata.num_warps * 32
    kernel.function = function
    kernel._run = StaticLauncher(kernel.src, kernel.metadata)
    kernel.module = module  # last: a kernel with a module counts as loaded


def hook_set(hook: Any) -> bool:
    """Whether a Triton hook is set: Triton 3.6 and 3.9 keep hooks in HookChains, empty
    unless a profiler adds one; a plain callable counts as set."""
    return hook is not None and (not hasattr(hook, "calls") or bool(hook.calls))


def _load_hooked() -> bool:
    from triton import knobs

    runtime = knobs.runtime
    return hook_set(getattr(runtime, "kernel_load_start_hook", None)) or hook_set(
        getattr(runtime, "kernel_load_end_hook", None))


def lazy_driver() -> None:
    """Where Triton's CUDA driver is not made yet and `available`, make the active one a
    CUDA driver that builds its C utility module (`CudaUtils`: ~1 s of the C compiler on a
    machine whose Triton cache lacks it) only when something uses it. Kernels loaded by
    `load` never do: a fresh machine loading a service hit's binaries runs no C compiler.
    Everything else the driver does is Triton's own. Kiln calls this wherever it is about
    to make Triton's driver; a Triton whose driver classes differ keeps its own driver."""
    if not available():
        return
    from triton.runtime.driver import driver

    with _driver_lock:
        if getattr(driver, "_active", None) is not None or getattr(driver, "_default", None) is not None:
            return
        try:
            lazy = _lazy_driver_class()()
        except Exception as exc:  # noqa: BLE001 - Triton's own driver then, as without this
            log.debug("static launcher: no lazy Triton driver (%s: %s)", type(exc).__name__, exc)
            return
        driver.set_active(lazy)


def _lazy_driver_class() -> type:
    import functools

    from triton.backends.driver import GPUDriver
    from triton.backends.nvidia.driver import CudaDriver, CudaLauncher, CudaUtils

    class LazyUtilsCudaDriver(CudaDriver):
        def __init__(self) -> None:  # CudaDriver's, less the eager `CudaUtils()`
            self.launcher_cls = CudaLauncher
            GPUDriver.__init__(self)

        @functools.cached_property
        def utils(self) -> Any:
            return CudaUtils()

    return LazyUtilsCudaDriver
