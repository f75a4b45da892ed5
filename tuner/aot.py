"""A built graph's kernels compiled for a GPU target on a machine without one, with verdicts.

`compile_launch` compiles one launch through `compiler.aot.compile_for_target` (the JIT's
own specialisation on a stand-in driver, so the binary lands under the Triton cache key a
client's JIT looks up) and checks that it fits the target: the compiled kernel's metadata
gives its shared memory, the cubin's resource table (`cuobjdump`, shipped with Triton) its
registers. The tuner's CPU compile workers (`compile_kernel`) reject a candidate that does
not compile or cannot launch on the target before a GPU sees it, and the service's target
compile (`service.target_compile`) proves a published schedule's kernels do; errors read
the same for both callers.
"""

from __future__ import annotations

import logging
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.aot import LaunchSpec, compile_for_target, cuda_arch, launch_specs
from tuner.records import BUILD_ERROR, OUT_OF_RESOURCES
from tuner.space import TargetLimits, limits_for

log = logging.getLogger(__name__)

_RESOURCES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


class AotError(RuntimeError):
    """A launch that does not compile for the target or does not fit it. Its text is the
    verdict the tuner records and the service reports: `<reason>: kernel <name> does not
    compile for|fit <arch>...`, the reason being `build_error` or `out_of_resources`."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(f"{reason}: {text}")
        self.reason = reason


@dataclass(frozen=True)
class TargetBinary:
    """One launch compiled for a target: Triton's compiled kernel, the resource counts of
    its cubin (`resource_usage`), the seconds its compile took (specialisation included), and the Triton cache
    key it was compiled under when that is the key a client's JIT looks up for the launch
    (None when the launch could not be specialised as the JIT does)."""

    compiled: Any
    resources: dict[str, int]
    seconds: float
    key: str | None = None


def compile_launch(spec: LaunchSpec, target: Any, limits: TargetLimits | None = None) -> TargetBinary:
    """Compile one launch for the CUDA target's GPU (no GPU needed) and check that it fits
    the target's shared memory and registers per block; raises `AotError` when it does not
    compile or fit, ValueError for a target that is not CUDA sm_XY. Needs a process whose
    Triton was imported with TRITON_INTERPRET=0: under the interpreter, triton.language's
    own @jit helpers are interpreted functions that do not lower for a GPU."""
    arch = cuda_arch(target)
    limits = limits or limits_for(target)
    start = time.monotonic()
    try:
        compiled, key = compile_for_target(spec, arch)
    except Exception as exc:  # Triton's errors span many types; all mean "does not compile"
        raise AotError(
            BUILD_ERROR,
            f"kernel {spec.kernel} does not compile for {target.arch} "
            f"(config {spec.constexprs | spec.options}): {_reason(exc)}",
        ) from exc
    seconds = time.monotonic() - start
    resources = resource_usage(compiled.asm.get("cubin", b""))
    why = fit_error(compiled, limits, resources.get("registers"))
    if why:
        raise AotError(OUT_OF_RESOURCES, f"kernel {spec.kernel} does not fit {target.arch}: {why}")
    return TargetBinary(compiled, resources, seconds, key)


def fit_error(compiled: Any, limits: TargetLimits, registers: int | None = None) -> str | None:
    """Why a compiled kernel cannot launch within the limits (shared memory, and registers
    per block when the per-thread count is known), or None."""
    shared = int(getattr(compiled.metadata, "shared", 0))
    if shared > limits.shared_memory:
        return f"needs {shared} B shared memory, the target allows {limits.shared_memory}"
    threads = int(compiled.metadata.num_warps) * 32
    if registers is not None and registers * threads > limits.registers_per_block:
        return (
            f"{registers} registers x {threads} threads exceed the "
            f"{limits.registers_per_block} registers of a block"
        )
    return None


def _reason(exc: BaseException) -> str:
    """One line saying why. A Triton CompilationError's text is "at L:C:" and the source
    around the fault; the reason is the `error_message` somewhere down its cause chain."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines or not lines[0].startswith("at "):
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]
    why, inner = "", exc
    while inner is not None and not why:
        why = getattr(inner, "error_message", None) or ""
        inner = inner.__cause__
    return f"{type(exc).__name__} {lines[0]} {why or 'no reason given'}"[:500]


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers, stack, static shared and local bytes of a cubin's one kernel, from
    `cuobjdump --dump-resource-usage`; empty (logged) when the tool is missing or fails."""
    try:
        from triton import knobs

        tool = knobs.nvidia.cuobjdump.path
        with tempfile.TemporaryDirectory(prefix="kiln-cubin-") as tmp:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
            out = subprocess.run(
                [tool, "--dump-resource-usage", str(path)],
                capture_output=True, text=True, timeout=60, check=True,
            ).stdout
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("no register counts for a kernel: cuobjdump failed (%s)", exc)
        return {}
    match = _RESOURCES.search(out)
    if match is None:
        log.warning("no register counts for a kernel: cuobjdump printed no resource table")
        return {}
    regs, stack, shared, local = (int(g) for g in match.groups())
    return {"registers": regs, "stack_bytes": stack, "static_shared_bytes": shared,
            "local_bytes": local}


def compile_kernel(
    built: Any, kernel: str, target: Any, limits: TargetLimits | None = None
) -> str | None:
    """Compile every launch of `kernel` in `built` for the target; the first error or None."""
    for spec in launch_specs(built):
        if spec.kernel == kernel:
            try:
                compile_launch(spec, target, limits)
            except AotError as exc:
                return str(exc)
    return None


def warm_kernel(built: Any, kernel: str, limits: TargetLimits) -> str | None:
    """JIT-compile `kernel`'s launches for this process's GPU without running them.

    `warmup` takes dtypes in place of tensors and specialises exactly as a launch on
    16-byte aligned buffers does, so the compiled binary lands in Triton's cache under the
    key the runner's launch will look up. The first error, or None.
    """
    for spec in launch_specs(built):
        if spec.kernel != kernel:
            continue
        compiled = spec.fn.warmup(*spec.arg_dtypes, grid=(1,), **spec.constexprs, **spec.options)
        why = fit_error(compiled, limits)  # registers: the device checks them on loading
        if why:
            return f"{OUT_OF_RESOURCES}: kernel {spec.kernel} does not fit this GPU: {why}"
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()  # loads the binary: raises OutOfResources where the device says so
    return None
