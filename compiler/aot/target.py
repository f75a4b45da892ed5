"""Compile a built graph's launches for a CUDA GPU this machine does not have.

Triton compiles for `GPUTarget("cuda", 90, 32)` on the CPU. The launch details (kernel
function, argument dtypes, block sizes, options) come from `compiler.Built.launches()`
(`launch_specs`). Each launch is specialised by Triton's own JIT, run against a stand-in
driver for the target (`specialize.standin_specialization`): argument types, 16-byte
alignment of every pointer, constants and options exactly as the client's JIT computes them
in `Built.precompile`, and compiled by `triton_compile.compile_spec`, the client's compile
workers' path. So the binary lands under the Triton cache key the client's JIT looks up,
which is what the service stores and ships it by. The tuner's CPU compile workers and the
service's target compile compile through here (`tuner/aot.py` adds their verdicts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from compiler.aot.sources import fresh_function
from compiler.aot.specialize import standin_specialization
from compiler.aot.triton_compile import compile_signature, compile_spec

log = logging.getLogger(__name__)

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


def cuda_arch(target: Any) -> int:
    """A `compiler.Target`'s compute capability as `GPUTarget` takes it (90 for sm_90);
    ValueError for a target that is not CUDA sm_XY."""
    arch = getattr(target, "cuda_arch", None) if target.device_type == "cuda" else None
    if arch is None:
        raise ValueError(f"compiling for the target needs a CUDA sm_XY target, not {target.arch}")
    return arch


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
    helpers too), from the source `compiler.build` generated in this process and checked
    against its sha256 (nothing is read back from $KILN_KERNEL_DIR: anyone who can write
    there could change the file)."""
    found = next((k for k in built.kernels if k.name == kernel), None)
    if found is None:
        raise AotUnavailable(f"built graph has no kernel {kernel!r}")
    try:
        return fresh_function(kernel, found.source, found.source_hash, fn_name)
    except ValueError as exc:
        raise AotUnavailable(str(exc)) from exc


def compile_for_target(spec: LaunchSpec, arch: int) -> tuple[Any, str | None]:
    """Compile one launch for a CUDA GPU of compute capability `arch` (no GPU needed): the
    `triton.compile` result, and the Triton cache key it was compiled under when that is
    the key a client's JIT looks up for the launch (None when the JIT could not specialise
    it: then it compiles for its plain signature, a binary no client looks up). Raises what
    Triton raises for a launch that does not compile. Needs a process whose Triton was
    imported with TRITON_INTERPRET=0: under the interpreter, triton.language's own @jit
    helpers are interpreted functions that do not lower for a GPU."""
    jit = _jit_specialization(spec, arch)
    if jit is None:
        return compile_signature(spec.fn, spec.signature, spec.constexprs, spec.options, arch), None
    fn, data = jit
    compiled = compile_spec(fn, data)
    return compiled, getattr(compiled, "hash", None)


def _jit_specialization(spec: LaunchSpec, arch: int) -> tuple[Any, str] | None:
    """A fresh JIT function for the launch's kernel and the specialization Triton's JIT
    computes for the launch on aligned buffers of a `arch` GPU, or None (no source to make
    the function from, or the JIT refuses the launch: the plain compile reports why)."""
    if not spec.source:
        return None
    try:
        fn = fresh_function(spec.kernel, spec.source, spec.source_hash, spec.fn.fn.__name__)
        data = standin_specialization(fn, spec.arg_dtypes, spec.constexprs, spec.options, arch)
    except Exception as exc:  # noqa: BLE001 - the plain compile reports the real error
        log.debug("kernel %s: no JIT specialisation (%s)", spec.kernel, exc)
        return None
    return (fn, data) if data is not None else None
