"""Compile a heuristic build's kernels for a CUDA target, on the CPU worker (no GPU needed).

Triton lowers a kernel down to a cubin for `GPUTarget("cuda", cc, 32)` without a device, so
the CPU worker proves that every kernel of the schedule it publishes compiles for the
target's architecture and fits it (shared memory, registers per block), and keeps what the
compiled kernel says about itself for inspection: registers per thread, spills, shared
memory, binary size. Compiling and checking a launch is `tuner.aot.compile_launch`, the
tuner's path too; this module adds the compile process, the facts stored and the job's error.

Each distinct kernel's binary (metadata and cubin, as Triton's cache keeps them) comes back
too, under the Triton cache key a client's JIT computes for the launch (the compile
specialises every launch as the client's `Built.precompile` does): the worker stores them
(`service.store.binaries`) and clients fetch them instead of compiling.

A heuristic build compiles its kernels in its own child (`service.build_child`, which runs
`compile_kernels` right after building: the graph is parsed and built once). A tuned
schedule's kernels are compiled by `compile_schedule`, in a child forked from the
compiling fork server (`service.forkserver.compiles`): a process that imported Triton under
TRITON_INTERPRET=1, as the CPU worker does to check CPU targets, has interpreted
`tl.max`/`tl.sum` helpers and cannot compile for a real GPU, and a GPU worker's own process
may hold a CUDA context, which a fork must not copy. That child rebuilds the graph from the
wire JSON and the schedule, whose source hashes make sure it compiles exactly the kernels
that are published. Binaries travel back as raw bytes messages (`send_binaries`), never
pickle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from compiler.child import Channel, Child, ChildDied, ChildTimeout, Limits
from service import forkserver

COMPILE_TIMEOUT_S = 900.0  # every kernel of one graph; past it the process is killed
COMPILE_NICE = 10  # as a build's child: the API's requests win a core from a compile


class TargetCompileError(ValueError):
    """A kernel does not compile for the target, or does not fit it: the same build fails
    the same way on every attempt, so the job fails at once with this message."""


@dataclass
class TargetCompile:
    """What compiling a schedule for its target gave: kernel name -> compile facts, and one
    binary record per distinct kernel binary: `{"key": Triton cache key, "kernel",
    "source_hash", "arch", "files": {name: bytes}}` (`service.store.binaries` stores them)."""

    facts: dict[str, dict[str, Any]]
    binaries: list[dict[str, Any]] = field(default_factory=list)


def compile_schedule(wire: str, schedule: dict[str, Any],
                     timeout_s: float = COMPILE_TIMEOUT_S) -> TargetCompile:
    """Compile every kernel of `schedule` (JSON, source hashes filled, for a CUDA target)
    for its target, in a child: the compile facts and binaries. Raises
    `TargetCompileError` when a kernel does not compile or fit, RuntimeError when the
    child dies or runs past `timeout_s` (the worker retries those)."""
    proc = forkserver.compiles.start("service.target_compile:_compile_child",
                                     name="target-compile", deadline_s=timeout_s,
                                     limits=Limits(nice=COMPILE_NICE))
    try:
        proc.send(schedule)
        proc.send_bytes(wire.encode())
        reply = proc.recv()
        if "error" in reply:
            raise TargetCompileError(reply["error"])
        return TargetCompile(reply["facts"], receive_binaries(proc, reply["binaries"]))
    except ChildTimeout as exc:
        raise RuntimeError(f"compiling the kernels for the target took over {timeout_s:.0f} s") from exc
    except ChildDied as exc:
        raise RuntimeError(f"the target-compile process died while compiling ({exc})") from exc
    finally:
        proc.close()


def _compile_child(channel: Channel) -> None:
    """In the child: rebuild the graph with the schedule and compile it; `{"facts",
    "binaries"}` then the binaries' files, or `{"error": the TargetCompileError's text}`."""
    import compiler

    schedule = compiler.Schedule.from_json(channel.recv())
    built = compiler.build(compiler.from_wire(channel.recv_bytes().decode()), schedule)
    try:
        compiled = compile_kernels(built, compiler.Target.from_json(schedule.target))
    except TargetCompileError as exc:
        channel.send({"error": str(exc)})
        return
    channel.send({"facts": compiled.facts, "binaries": binaries_manifest(compiled.binaries)})
    send_binaries(channel, compiled.binaries)


def warm_up() -> None:
    """In the compiling fork server, once: what every compile would otherwise pay in each
    child, Triton's compiler imports and its cache key of itself (a hash of its sources and
    its ~500 MB library, part of every compile's key)."""
    import triton.compiler  # noqa: F401
    from triton.runtime.cache import triton_key

    triton_key()


def binaries_manifest(binaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The binary records as JSON, each file named but not included (`send_binaries`)."""
    return [dict(record, files=sorted(record["files"])) for record in binaries]


def send_binaries(channel: Channel, binaries: list[dict[str, Any]]) -> None:
    """Each file of each record, as a bytes message, in the manifest's order."""
    for record in binaries:
        for name in sorted(record["files"]):
            channel.send_bytes(record["files"][name])


def receive_binaries(proc: Child, manifest: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of a manifest with their files, read from the child."""
    return [dict(record, files={name: proc.recv_bytes() for name in record["files"]})
            for record in manifest]


def compile_kernels(built: Any, target: Any) -> TargetCompile:
    """Compile every Triton kernel of `built` (a `compiler.Built`) for the CUDA `target`
    through `tuner.aot.compile_launch`: kernel name -> compile facts (kernels that are ATen
    calls alone have none), and the binary of each distinct kernel. Raises `TargetCompileError` naming the kernel, the target and
    the reason when one does not compile or does not fit. Needs a process whose Triton was
    imported with the interpreter off (see `compile_schedule`)."""
    from compiler import aot
    from tuner.aot import AotError, compile_launch
    from tuner.space import limits_for

    aot.cuda_arch(target)  # ValueError for a target that is not CUDA sm_XY
    limits = limits_for(target)
    facts: dict[str, dict[str, Any]] = {}
    sources = {k.name: k.source_hash for k in built.kernels}
    binaries: dict[str, dict[str, Any]] = {}  # one compile per distinct binary (layer twins)
    records: dict[str, dict[str, Any]] = {}  # Triton cache key -> binary record
    for spec in aot.launch_specs(built):
        if spec.kernel in facts:  # another launch of the same kernel: the same binary
            continue
        binary = json.dumps([sources.get(spec.kernel), spec.signature, spec.constexprs,
                             spec.options], sort_keys=True)
        if binary in binaries:
            facts[spec.kernel] = dict(binaries[binary], compile_s=0.0)
            continue
        try:
            compiled = compile_launch(spec, target, limits)
        except AotError as exc:
            raise TargetCompileError(str(exc)) from exc
        facts[spec.kernel] = binaries[binary] = _facts(compiled, target)
        if compiled.key is not None and compiled.key not in records:
            records[compiled.key] = {"key": compiled.key, "kernel": spec.kernel,
                                     "source_hash": sources.get(spec.kernel), "arch": target.arch,
                                     "files": aot.binary_files(compiled.compiled)}
    # An ATen call with no epilogue (a bare cuBLAS matmul) has no Triton code to compile.
    missing = [k.name for k in built.kernels if k.triton and k.name not in facts]
    if missing:
        raise TargetCompileError(f"kernels {missing} have no launch to compile for {target.arch}")
    return TargetCompile(facts, list(records.values()))


def _facts(binary: Any, target: Any) -> dict[str, Any]:
    """What a `tuner.aot.TargetBinary`'s metadata and its cubin's resource table say."""
    md, usage = binary.compiled.metadata, binary.resources
    return {
        "arch": target.arch,
        "num_warps": int(md.num_warps),
        "num_stages": int(md.num_stages),
        "shared_bytes": int(md.shared),  # what a launch requests (dynamic shared memory)
        "registers": usage.get("registers"),  # per thread
        "spills": usage["local_bytes"] // 4 if "local_bytes" in usage else None,  # as Triton counts
        "local_bytes": usage.get("local_bytes"),
        "stack_bytes": usage.get("stack_bytes"),
        "static_shared_bytes": usage.get("static_shared_bytes"),
        "binary_bytes": len(binary.compiled.asm.get("cubin", b"")),
        "compile_s": round(binary.seconds, 3),
    }
