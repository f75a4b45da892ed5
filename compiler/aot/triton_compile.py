"""The one place kiln calls `triton.compile` and builds its `ASTSource`: the compile of a
launch as Triton's JIT specialised it, the cache key that compile stores its binary under,
and the plain compile of a signature for launches the JIT could not specialise.

A launch's specialisation is Triton's own `specialization_data` (JSON text, captured by
`compiler/aot/specialize.py`): signature, constants, alignment attributes, options and
target. `compile_spec` turns it back into what the JIT passes `triton.compile` for that
launch, so the binary lands in Triton's cache under the key the JIT looks up (`cache_key`).
The client's compile workers, the service's target compile and the tuner's CPU compile
workers all compile through here. Torch-free: the compile workers import it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def gpu_target(arch: int) -> Any:
    """Triton's target for a CUDA GPU of compute capability `arch` (90 for sm_90)."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


def _decode(fn: Any, spec: str) -> tuple[Any, Any, dict[str, Any]]:
    """Triton's ASTSource, GPUTarget and options for a specialization (JSON text), as the
    JIT builds them for that launch: constants, attributes and options back from JSON."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    data = json.loads(spec)

    def listed(value: Any) -> Any:  # JSON made tuples lists (Triton's preload does the same)
        return tuple(value) if isinstance(value, list) else value

    def constant(value: Any) -> Any:
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(listed(value["constexpr"]))
        if isinstance(value, dict):
            raise ValueError(f"constant {value} is not a value kiln passes")
        if isinstance(value, str) and tl.dtype.is_dtype(value):
            return tl.dtype(value)
        return listed(value)

    constexprs = {tuple(k): constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"],
                                                        strict=True)}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    signature = {k: listed(v) for k, v in data["signature"].items()}
    options = {k: listed(v) for k, v in data["options"].items()}
    return ASTSource(fn, signature, constexprs, attrs), GPUTarget(**data["target"]), options


def compile_spec(fn: Any, spec: str) -> Any:
    """`triton.compile` of the JIT function `fn` as specialised by `spec` (a launch's
    specialization data, `specialization` or `standin_specialization`): the binary lands in
    Triton's cache under the key the JIT looks up for that launch, `cache_key(fn, spec)`."""
    src, target, options = _decode(fn, spec)
    return _compile(src, target, options)


def compile_signature(fn: Any, signature: dict[str, str], constexprs: dict[str, Any],
                      options: dict[str, Any], arch: int) -> Any:
    """`triton.compile` of `fn` for a plain signature (no alignment attributes) for a CUDA
    GPU of compute capability `arch`: for launches the JIT could not specialise, whose
    binaries no client looks up; the compile still says whether the kernel builds."""
    from triton.compiler import ASTSource

    return _compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                    gpu_target(arch), options)


def _compile(src: Any, target: Any, options: dict[str, Any]) -> Any:
    import triton

    return triton.compile(src, target=target, options=options)


def cache_key(fn: Any, spec: str) -> str | None:
    """The key under which `triton.compile` keeps (and finds) the binary of `fn` as
    specialised by `spec` in Triton's cache: sha256 of Triton's version and sources, the
    kernel's source and specialisation, the backend (ptxas version, arch), the options and
    the cache-invalidating environment. What `compile_spec` computes before compiling, so a
    binary compiled elsewhere under this key is the one this process's JIT would load. None
    where this Triton adds something kiln cannot see (a stages-inspection hook)."""
    from triton import knobs
    from triton.compiler.compiler import get_cache_invalidating_env_vars, make_backend
    from triton.runtime.cache import get_cache_key

    if getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None:
        return None
    src, target, options = _decode(fn, spec)
    backend = make_backend(target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def backend_hash(target: Any) -> None:
    """Pay what the first cache key of a kernel for `target` asks of Triton's backend once
    (the NVIDIA one runs `ptxas --version` twice, 20-40 ms of waiting, and hashes libdevice;
    each cached for the process), so that the first specialisation does not wait for it."""
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    backend.hash()
    backend.parse_options({}).hash()
