"""Ahead-of-time compile of a built graph's kernels for a GPU target, on a machine without one.

Triton compiles for `GPUTarget("cuda", 90, 32)` on the CPU; the compiled kernel's metadata
says how much shared memory it needs, so a CPU worker can reject a candidate that cannot
launch on the target (out of resources) or does not compile, before a GPU sees it.

The launch details (kernel function, argument dtypes, block sizes, options) come from
`compiler.Built.launches()`, the compiler's public description of a built graph's launches.
"""

from __future__ import annotations

import linecache
import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from tuner.records import BUILD_ERROR, OUT_OF_RESOURCES
from tuner.space import TargetLimits, limits_for

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
        specs.append(
            LaunchSpec(
                launch.kernel, fn, signature, dict(launch.constexprs), dict(launch.options), dtypes
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
    from compiler.runtime.built import source_hash

    found = next((k for k in built.kernels if k.name == kernel), None)
    if found is None:
        raise AotUnavailable(f"built graph has no kernel {kernel!r}")
    if source_hash(found.source) != found.source_hash:
        raise AotUnavailable(f"kernel {kernel}: source does not match its sha256")
    digest = found.source_hash
    filename = f"<kiln-aot kiln_{digest}.py>"
    linecache.cache[filename] = (
        len(found.source), None, found.source.splitlines(keepends=True), filename
    )
    module = types.ModuleType(f"kiln_aot_{digest}")
    module.__file__ = filename
    with interpreter_off():
        exec(compile(found.source, filename, "exec"), module.__dict__)  # noqa: S102 - hash-checked
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


def compile_for(spec: LaunchSpec, target: Any, limits: TargetLimits | None = None) -> str | None:
    """Compile one launch for the target's GPU; an error string, or None when it fits."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    arch = getattr(target, "cuda_arch", None) or 90
    limits = limits or limits_for(target)
    try:
        with interpreter_off():
            compiled = triton.compile(
                ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs),
                target=GPUTarget("cuda", arch, 32),
                options=spec.options,
            )
    except Exception as exc:  # a config Triton cannot lower is a recorded verdict
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        return f"{BUILD_ERROR}: {spec.kernel}: {text}"
    return shared_memory_error(spec, compiled, limits)


def shared_memory_error(spec: LaunchSpec, compiled: Any, limits: TargetLimits) -> str | None:
    """An out-of-resources verdict when the compiled kernel needs more shared memory than allowed."""
    shared = int(getattr(compiled.metadata, "shared", 0))
    if shared > limits.shared_memory:
        return (
            f"{OUT_OF_RESOURCES}: {spec.kernel} needs {shared} B shared memory, "
            f"the target allows {limits.shared_memory}"
        )
    return None


def compile_kernel(
    built: Any, kernel: str, target: Any, limits: TargetLimits | None = None
) -> str | None:
    """Compile every launch of `kernel` in `built` for the target; the first error or None."""
    for spec in launch_specs(built):
        if spec.kernel == kernel:
            error = compile_for(spec, target, limits)
            if error:
                return error
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
        error = shared_memory_error(spec, compiled, limits)
        if error:
            return error
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()  # loads the binary: raises OutOfResources where the device says so
    return None
