"""Ahead-of-time compile of a built graph's kernels for a GPU target, on a machine without one.

Triton compiles for `GPUTarget("cuda", 90, 32)` on the CPU. `compile_launch` is the one
place that does it: the tuner's CPU compile workers (`compile_kernel`) reject a candidate
that does not compile or cannot launch on the target before a GPU sees it, and the
service's target compile (`service.target_compile`) proves a published schedule's kernels
do. The compiled kernel's metadata gives its shared memory, the cubin's resource table
(`cuobjdump`, shipped with Triton) its registers; errors read the same for both callers.

The launch details (kernel function, argument dtypes, block sizes, options) come from
`compiler.Built.launches()`, the compiler's public description of a built graph's launches.
Each launch is specialised by Triton's own JIT, run against a stand-in driver for the
target (`compiler.runtime.compile_pool.standin_specialization`): argument types, 16-byte
alignment of every pointer, constants and options exactly as the client's JIT computes them
in `Built.precompile`, and compiled by `compile_pool.compile_spec`, the client's compile
workers' path. So the binary lands under the Triton cache key the client's JIT looks up
(`TargetBinary.key`), which is what the service stores and ships it by.
"""

from __future__ import annotations

import linecache
import logging
import os
import re
import subprocess
import tempfile
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuner.records import BUILD_ERROR, OUT_OF_RESOURCES
from tuner.space import TargetLimits, limits_for

log = logging.getLogger(__name__)

_RESOURCES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")

_TL_DTYPES = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}


class AotUnavailable(RuntimeError):
    """The built graph does not expose what an ahead-of-time compile needs."""


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel launch of a built graph, as Triton's ahead-of-time compiler needs it."""

    kernel: str
    fn: Any  # triton JITFunction
    signature: dict[str, str]
    constexprs: dict[str, int]
    options: dict[str, int]
    arg_dtypes: tuple[torch.dtype, ...] = ()
    source: str = ""  # the kernel's generated source (a fresh JIT function is made from it)
    source_hash: str = ""


def launch_specs(built: Any) -> list[LaunchSpec]:
    """The Triton launches of a `compiler.Built` (from `Built.launches()`), each with its
    argument signature, block sizes and launch options."""
    from triton.runtime.jit import JITFunction

    specs = []
    for launch in built.launches():
        fn = launch.fn
        if not isinstance(fn, JITFunction):  # imported under TRITON_INTERPRET=1
            fn = _compilable(built, launch.kernel, getattr(fn.fn, "__name__", launch.kernel))
        dtypes = tuple(launch.arg_dtypes)
        signature = {
            name: "*" + _TL_DTYPES[d] for name, d in zip(fn.arg_names, dtypes, strict=False)
        }
        signature.update({k: "constexpr" for k in launch.constexprs})
        kernel = next((k for k in built.kernels if k.name == launch.kernel), None)
        specs.append(
            LaunchSpec(
                launch.kernel, fn, signature, dict(launch.constexprs), dict(launch.options), dtypes,
                kernel.source if kernel is not None else "",
                kernel.source_hash if kernel is not None else "",
            )
        )
    return specs


def _compilable(built: Any, kernel: str, fn_name: str) -> Any:
    """The kernel's JIT function re-imported with the interpreter off (its @triton.jit
    helpers too), from the source `compiler.build` generated in this process.

    Nothing is read back from $KILN_KERNEL_DIR (anyone who can write there could change
    the file): the source held by `built.kernels` is re-checked against its sha256, then
    executed as a fresh module whose source `inspect` (hence Triton) finds in `linecache`.
    """
    found = next((k for k in built.kernels if k.name == kernel), None)
    if found is None:
        raise AotUnavailable(f"built graph has no kernel {kernel!r}")
    return _fresh_function(kernel, found.source, found.source_hash, fn_name)


def _fresh_function(kernel: str, source: str, digest: str, fn_name: str) -> Any:
    """A new module made from a kernel's hash-checked source, its `fn_name` function."""
    from compiler.runtime.built import source_hash

    if source_hash(source) != digest:
        raise AotUnavailable(f"kernel {kernel}: source does not match its sha256")
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
    its cubin (`resource_usage`), the seconds `triton.compile` took, and the Triton cache
    key it was compiled under when that is the key a client's JIT looks up for the launch
    (None when the launch could not be specialised as the JIT does)."""

    compiled: Any
    resources: dict[str, int]
    seconds: float
    key: str | None = None


def cuda_arch(target: Any) -> int:
    """The target's compute capability as `GPUTarget` takes it (90 for sm_90)."""
    arch = getattr(target, "cuda_arch", None) if target.device_type == "cuda" else None
    if arch is None:
        raise ValueError(f"compiling for the target needs a CUDA sm_XY target, not {target.arch}")
    return arch


def compile_launch(spec: LaunchSpec, target: Any, limits: TargetLimits | None = None) -> TargetBinary:
    """Compile one launch for the CUDA target's GPU (no GPU needed) and check that it fits
    the target's shared memory and registers per block; raises `AotError` when it does not
    compile or fit, ValueError for a target that is not CUDA sm_XY. Needs a process whose
    Triton was imported with TRITON_INTERPRET=0: under the interpreter, triton.language's
    own @jit helpers are interpreted functions that do not lower for a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from compiler.runtime import compile_pool

    arch = cuda_arch(target)
    limits = limits or limits_for(target)
    jit = _jit_specialization(spec, arch)
    start = time.monotonic()
    try:
        if jit is not None:
            fn, data = jit
            compiled = compile_pool.compile_spec(fn, data)
        else:  # no JIT specialisation: plain signature (a binary no client looks up)
            compiled = triton.compile(
                ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs),
                target=GPUTarget("cuda", arch, 32),
                options=spec.options,
            )
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
    key = getattr(compiled, "hash", None) if jit is not None else None
    return TargetBinary(compiled, resources, seconds, key)


def _jit_specialization(spec: LaunchSpec, arch: int) -> tuple[Any, str] | None:
    """A fresh JIT function for the launch's kernel and the specialization Triton's JIT
    computes for the launch on aligned buffers of a `arch` GPU, or None (no source to make
    the function from, or the JIT refuses the launch: the plain compile reports why)."""
    from compiler.runtime import compile_pool

    if not spec.source:
        return None
    try:
        fn = _fresh_function(spec.kernel, spec.source, spec.source_hash,
                             spec.fn.fn.__name__)
        data = compile_pool.standin_specialization(fn, spec.arg_dtypes, spec.constexprs,
                                                   spec.options, arch)
    except Exception as exc:  # noqa: BLE001 - the plain compile below reports the real error
        log.debug("kernel %s: no JIT specialisation (%s)", spec.kernel, exc)
        return None
    return (fn, data) if data is not None else None


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
