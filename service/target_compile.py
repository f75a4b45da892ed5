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

The compile runs in a spawned process with the interpreter off (`compile_schedule`): a
process that imported Triton under TRITON_INTERPRET=1, as the CPU worker does to check CPU
targets, has interpreted `tl.max`/`tl.sum` helpers and cannot compile for a real GPU. The
process lives on across jobs; it rebuilds the graph from the wire JSON and the schedule,
whose source hashes make sure it compiles exactly the kernels that are published.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

COMPILE_TIMEOUT_S = 900.0  # every kernel of one graph; past it the process is killed
COMPILE_NICE = 10  # as a build child (service.build_child.BUILD_NICE)
_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


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
    for its target, in the compile process: the compile facts and binaries. Raises
    `TargetCompileError` when a kernel does not compile or fit, RuntimeError when the
    compile process dies or runs past `timeout_s` (the worker retries those)."""
    future = _compile_pool().submit(_compile_in_child, wire, json.dumps(schedule))
    try:
        verdict, payload = future.result(timeout=timeout_s)
    except BrokenProcessPool as exc:
        _drop_pool(kill=False)
        raise RuntimeError("the target-compile process died while compiling") from exc
    except FutureTimeout as exc:
        _drop_pool(kill=True)
        raise RuntimeError(f"compiling the kernels for the target took over {timeout_s:.0f} s") from exc
    if verdict == "error":
        raise TargetCompileError(payload)
    return payload


def _compile_in_child(wire: str, schedule_text: str) -> tuple[str, Any]:
    """In the compile process: ("ok", TargetCompile) or ("error", the TargetCompileError's text)."""
    import compiler

    schedule = compiler.Schedule.from_json(json.loads(schedule_text))
    built = compiler.build(compiler.from_wire(wire), schedule)
    try:
        return "ok", compile_kernels(built, compiler.Target.from_json(schedule.target))
    except TargetCompileError as exc:
        return "error", str(exc)


def _interpreter_off() -> None:
    os.environ["TRITON_INTERPRET"] = "0"  # before the child imports Triton
    os.nice(COMPILE_NICE)  # the API's lookups win a core from a compile


def _compile_pool() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                        initializer=_interpreter_off)
        return _pool


def _drop_pool(kill: bool) -> None:
    """Forget the compile process (killing it when it hangs); the next job starts another."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is None:
        return
    if kill:  # ProcessPoolExecutor cannot cancel a running task: end its process
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def shutdown(timeout_s: float = 10.0) -> None:
    """End the compile process (the service stopping), killing it past `timeout_s` (a job
    still compiling is retried after its lease). Left to exit handlers, it outlived a
    `kiln serve` stopped by SIGTERM, with its resource tracker: uvicorn ends such a
    process by raising the signal again once it has shut down, and no exit handler runs."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is None:
        return
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)  # an idle process exits at once
    for proc in processes:
        proc.join(timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()


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
