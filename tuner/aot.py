"""Ahead-of-time compile of a built graph's kernels for a GPU target, on a machine without one.

Triton compiles for `GPUTarget("cuda", 90, 32)` on the CPU; the compiled kernel's metadata
says how much shared memory it needs, so a CPU worker can reject a candidate that cannot
launch on the target (out of resources) or does not compile, before a GPU sees it.

The launch details (kernel function, argument dtypes, block sizes) come from the built
graph's launch steps, which `compiler.runtime` does not publish yet: `launch_specs` reads
them and raises `AotUnavailable` with a clear message if their shape ever changes.
"""

from __future__ import annotations

import os
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
    """The Triton launches of a `compiler.Built`, with argument dtypes and block sizes."""
    from triton.runtime.jit import JITFunction

    try:
        nodes = list(built.program.gm.graph.nodes)
        execs = list(built._execs)
    except AttributeError as exc:
        raise AotUnavailable(f"compiler.Built no longer exposes its launches ({exc})") from exc
    from compiler.ir import meta

    specs = []
    for step in execs:
        launch = step if hasattr(step, "in_slots") else getattr(step, "epilogue", None)
        if launch is None or not hasattr(launch, "fn"):
            continue
        fn = launch.fn
        if not isinstance(fn, JITFunction):  # imported under TRITON_INTERPRET=1
            fn = _compilable(built, getattr(step, "name", launch.name), launch.name)
        dtypes = [meta(nodes[s]).dtype for s in launch.in_slots] + [o[3] for o in launch.outs]
        signature = {
            name: "*" + _TL_DTYPES[d] for name, d in zip(fn.arg_names, dtypes, strict=False)
        }
        signature.update({k: "constexpr" for k in launch.constexprs})
        kernel = getattr(step, "name", launch.name)
        specs.append(
            LaunchSpec(
                kernel, fn, signature, dict(launch.constexprs), dict(launch.options), tuple(dtypes)
            )
        )
    return specs


def _compilable(built: Any, kernel: str, fn_name: str) -> Any:
    """The kernel's JIT function re-imported with the interpreter off (its @triton.jit
    helpers too), from the file `compiler.build` wrote for this process's own source."""
    import importlib.util

    from compiler.runtime import kernel_dir

    digest = next(k.source_hash for k in built.kernels if k.name == kernel)
    path = kernel_dir() / digest[:2] / f"kiln_{digest}.py"
    with interpreter_off():
        spec = importlib.util.spec_from_file_location(f"kiln_aot_{digest}", path)
        if spec is None or spec.loader is None:
            raise AotUnavailable(f"cannot import generated kernel {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
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

    cc = getattr(target, "cc", None) or (9, 0)
    limits = limits or limits_for(target)
    try:
        with interpreter_off():
            compiled = triton.compile(
                ASTSource(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs),
                target=GPUTarget("cuda", cc[0] * 10 + cc[1], 32),
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
