"""A heuristic build job in one child process, with memory and time limits: parse the graph,
lower, fuse, generate, then check on the Triton interpreter (CPU target) or compile every
kernel for the target (CUDA target) — `pipeline.build_kernels`, once per job.

A graph of a few hundred bytes can describe hours of work or gigabytes of intermediates;
the build of such a graph must never hold a worker, or its host, longer than its limits.
Each build runs in a fresh child forked from a warm server that has kiln, torch and Triton
imported (`service.forkserver`: a child starts in milliseconds, and no thread of the worker
is forked; a CUDA target's child comes from the server whose Triton compiles for real
GPUs). The child's data segment is capped (`KILN_BUILD_MEMORY_MB`, `RLIMIT_DATA`: heap
and anonymous mappings, where tensors live; shared libraries do not count against it), it
runs niced below the API, and its CPU time is capped as a backstop should it outlive the
worker. The worker waits for the build up to `KILN_BUILD_TIMEOUT_S`, then for the target
compile up to `target_compile.COMPILE_TIMEOUT_S`, and kills the child past either: a
timed-out build frees its worker at once. Messages are JSON and raw bytes, never pickle
(`compiler.child`).

The conversation: the worker sends the wire graph (bytes); a CUDA target's child says
`{"stage": "compiling"}` once built; then `{"outcome": ..., "peak_mb"}` (followed by the
binaries' files, `target_compile.send_binaries`), `{"refused": why}` (over the build
budget), `{"target_error": why}` (a kernel does not compile or fit) or `{"error": why}`.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from compiler.child import Channel, ChildDied, ChildTimeout, Limits
from service import forkserver, metrics, pipeline, target_compile
from service.settings import Settings

log = logging.getLogger(__name__)

_OUT_OF_MEMORY = ("can't allocate memory", "MemoryError", "std::bad_alloc")
BUILD_NICE = 10  # below the API and its intake children (service.intake_child.NICE)


class BuildLimitError(RuntimeError):
    """A build passed its time or memory limit and was stopped. The same graph fails the
    same way on every attempt, so the job fails at once with this message."""


class BuildFailed(RuntimeError):
    """The build raised in the child; the message is the child's `Type: reason`."""


def run(build: Callable[[str, dict[str, Any], int], pipeline.Outcome] | None, wire: str,
        target_json: dict[str, Any], settings: Settings) -> pipeline.Outcome:
    """The worker's build hook: kiln's own build (`build` None) runs in a child with the
    settings' limits (`build_in_child`); a stand-in build passed to the Worker (tests)
    runs in this process as given."""
    if build is not None:
        return build(wire, target_json, settings.interpret_max_numel)
    return build_in_child(wire, target_json, settings.interpret_max_numel,
                          timeout_s=settings.build_timeout_s,
                          memory_bytes=settings.build_memory_mb << 20,
                          max_cost=settings.max_build_cost)


def build_in_child(wire: str, target_json: dict[str, Any], interpret_max_numel: int, *,
                   timeout_s: float, memory_bytes: int, max_cost: int = 0,
                   compile_timeout_s: float = target_compile.COMPILE_TIMEOUT_S) -> pipeline.Outcome:
    """`pipeline.build_kernels` in a child process; `memory_bytes` 0 means no memory cap,
    `max_cost` 0 no build budget.

    Raises `BuildLimitError` when the graph's price exceeds `max_cost` (the child refuses
    it before lowering), when the build runs past `timeout_s` (the child is killed) or runs
    out of memory, `TargetCompileError` when a kernel does not compile for or fit the
    target, RuntimeError when the child dies otherwise or its target compile runs past
    `compile_timeout_s` (the worker retries those), and `BuildFailed` carrying the child's
    error when the build fails (an invalid graph, a wrong interpreter result)."""
    cuda = target_json.get("device_type") == "cuda"
    backstop_s = timeout_s + (compile_timeout_s if cuda else 0)
    # CPU seconds, with room for the interpreter's threads; the worker kills it on wall time.
    limits = Limits(memory_bytes=memory_bytes, cpu_s=int(2 * backstop_s) + 10, nice=BUILD_NICE)
    started = time.monotonic()
    proc = forkserver.for_target(target_json).start(
        "service.build_child:_child", [target_json, interpret_max_numel, max_cost],
        name="build", limits=limits)
    try:
        proc.send_bytes(wire.encode())
        try:
            result = proc.recv(timeout_s)
        except ChildTimeout:
            raise BuildLimitError(
                f"the build ran past its time limit of {timeout_s:g} s (KILN_BUILD_TIMEOUT_S) "
                "and was stopped") from None
        except ChildDied as died:
            raise _died(died, memory_bytes) from None
        if result.get("stage") == "compiling":
            try:
                with metrics.timed("target_compile"):
                    result = proc.recv(compile_timeout_s)
            except ChildTimeout as exc:
                raise RuntimeError(f"compiling the kernels for the target took over "
                                   f"{compile_timeout_s:.0f} s") from exc
            except ChildDied as exc:
                raise RuntimeError(f"the build process died while compiling for the target "
                                   f"({exc})") from exc
        binaries = (target_compile.receive_binaries(proc, result["outcome"]["binaries"])
                    if "outcome" in result else [])
    finally:
        proc.close()
    log.debug("build child finished in %.2f s, peak RSS %s MB", time.monotonic() - started,
              result.get("peak_mb"))
    if "refused" in result:
        raise BuildLimitError(result["refused"])
    if "target_error" in result:
        raise target_compile.TargetCompileError(result["target_error"])
    if "error" in result:
        error = result["error"]
        if memory_bytes and any(mark in error for mark in _OUT_OF_MEMORY):
            raise BuildLimitError(f"the build needed more memory than its limit of "
                                  f"{memory_bytes >> 20} MB (KILN_BUILD_MEMORY_MB): {error[:300]}")
        raise BuildFailed(error)
    return pipeline.Outcome(**dict(result["outcome"], binaries=binaries))


def _died(died: ChildDied, memory_bytes: int) -> Exception:
    if memory_bytes:
        return BuildLimitError(f"{died} (memory limit {memory_bytes >> 20} MB, "
                               "KILN_BUILD_MEMORY_MB)")
    return RuntimeError(str(died))


def _child(channel: Channel, target_json: dict[str, Any], interpret_max_numel: int,
           max_cost: int) -> None:
    from compiler.lowering.budget import BuildRefused  # the fork server has compiler loaded

    wire = channel.recv_bytes().decode()
    binaries: list[dict[str, Any]] = []
    try:
        outcome = pipeline.build_kernels(wire, target_json, interpret_max_numel, max_cost,
                                         compiling=lambda: channel.send({"stage": "compiling"}))
        binaries = outcome.binaries
        payload: dict[str, Any] = {"outcome": dict(
            asdict(outcome), binaries=target_compile.binaries_manifest(binaries))}
    except BuildRefused as exc:
        payload = {"refused": str(exc)}
    except target_compile.TargetCompileError as exc:
        payload = {"target_error": str(exc)}
    except MemoryError:
        payload = {"error": "MemoryError: the build could not allocate memory"}
    except Exception as exc:  # reported to the worker, which records it on the job
        payload = {"error": f"{type(exc).__name__}: {exc}"}
    payload["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    channel.send(payload)
    target_compile.send_binaries(channel, binaries)
