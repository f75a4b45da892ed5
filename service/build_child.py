"""The CPU worker's builds (lowering, fusion, codegen, the interpreter check) in a child
process with memory and time limits.

A graph of a few hundred bytes can describe hours of work or gigabytes of intermediates;
the build of such a graph must never hold a worker, or its host, longer than its limits.
Each build runs in a fresh child forked from a forkserver that has kiln, torch and Triton
imported (`service.forkserver`: a child starts in milliseconds, and no thread of the worker
is forked). The child's data segment is capped (`RLIMIT_DATA`: heap and anonymous mappings,
where tensors live; shared libraries do not count against it), and its CPU time as a
backstop should it outlive the worker. The worker waits for the result up to the time
limit, then kills the child: a timed-out build frees its worker at once. Results come back as JSON, never pickle.

Compiling the kernels for a CUDA target stays in the worker (`pipeline.compile_for_target`
has its own compile process with its own time limit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from service import forkserver, pipeline
from service.settings import Settings

log = logging.getLogger(__name__)

_OUT_OF_MEMORY = ("can't allocate memory", "MemoryError", "std::bad_alloc")
BUILD_NICE = 10  # below the API and its intake children (service.intake_child.NICE)


class BuildLimitError(RuntimeError):
    """A build passed its time or memory limit and was stopped. The same graph fails the
    same way on every attempt, so the job fails at once with this message."""


class BuildFailed(RuntimeError):
    """The build raised in the child; the message is the child's `Type: reason`."""


def run(build: Callable[[str, dict[str, Any], int], pipeline.Outcome], wire: str, target_json: dict[str, Any],
        settings: Settings) -> pipeline.Outcome:
    """The worker's build hook: kiln's own build (`pipeline.build_heuristic`) runs in a
    child with the settings' limits (`build_in_child`); a stand-in build passed to the
    Worker (tests) runs in this process as given."""
    if build is not pipeline.build_heuristic:
        return build(wire, target_json, settings.interpret_max_numel)
    outcome = build_in_child(wire, target_json, settings.interpret_max_numel,
                             timeout_s=settings.build_timeout_s,
                             memory_bytes=settings.build_memory_mb << 20,
                             max_cost=settings.max_build_cost)
    return pipeline.compile_for_target(wire, target_json, outcome)


def build_in_child(wire: str, target_json: dict[str, Any], interpret_max_numel: int, *,
                   timeout_s: float, memory_bytes: int, max_cost: int = 0) -> pipeline.Outcome:
    """`pipeline.build_kernels` in a child process; `memory_bytes` 0 means no memory cap,
    `max_cost` 0 no build budget.

    Raises `BuildLimitError` when the graph's price exceeds `max_cost` (the child refuses
    it before lowering), when the child runs past `timeout_s` (it is killed) or runs
    out of memory, RuntimeError when it dies otherwise, and `BuildFailed` carrying the
    child's error when the build fails (an invalid graph, a wrong interpreter result)."""
    ctx = forkserver.context()
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, name="kiln-build",
                        args=(send, wire, target_json, interpret_max_numel, memory_bytes,
                              timeout_s, max_cost))
    started = time.monotonic()
    child.start()
    send.close()  # the child holds the only writer: its death reads as end of file
    try:
        if not receive.poll(timeout_s):
            raise BuildLimitError(
                f"the build ran past its time limit of {timeout_s:g} s (KILN_BUILD_TIMEOUT_S) "
                "and was stopped")
        try:
            result = json.loads(receive.recv_bytes())
        except EOFError:
            child.join(5)
            raise _died(child.exitcode, memory_bytes) from None
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join()
    log.debug("build child finished in %.2f s, peak RSS %s MB", time.monotonic() - started,
              result.get("peak_mb"))
    if "refused" in result:
        raise BuildLimitError(result["refused"])
    if "error" in result:
        error = result["error"]
        if memory_bytes and any(mark in error for mark in _OUT_OF_MEMORY):
            raise BuildLimitError(f"the build needed more memory than its limit of "
                                  f"{memory_bytes >> 20} MB (KILN_BUILD_MEMORY_MB): {error[:300]}")
        raise BuildFailed(error)
    return pipeline.Outcome(**result["outcome"])


def _died(exitcode: int | None, memory_bytes: int) -> Exception:
    if exitcode is not None and exitcode < 0:
        how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with status {exitcode}"
    if memory_bytes:
        return BuildLimitError(f"the build process {how} (memory limit {memory_bytes >> 20} MB, "
                               "KILN_BUILD_MEMORY_MB)")
    return RuntimeError(f"the build process {how}")


def _child(conn: Connection, wire: str, target_json: dict[str, Any], interpret_max_numel: int,
           memory_bytes: int, timeout_s: float, max_cost: int) -> None:
    # A backstop for a child that outlives its worker (killed -9): CPU seconds, with room
    # for the interpreter's threads; the worker kills it at `timeout_s` of wall time.
    cpu_s = int(2 * timeout_s) + 10
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    with contextlib.suppress(OSError):  # the API's lookups win a core from a build
        os.nice(BUILD_NICE)
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    from compiler.lowering.budget import BuildRefused  # the forkserver has compiler loaded

    try:
        outcome = pipeline.build_kernels(wire, target_json, interpret_max_numel, max_cost)
        payload = {"outcome": asdict(outcome)}
    except BuildRefused as exc:
        payload = {"refused": str(exc)}
    except MemoryError:
        payload = {"error": "MemoryError: the build could not allocate memory"}
    except Exception as exc:  # reported to the worker, which records it on the job
        payload = {"error": f"{type(exc).__name__}: {exc}"}
    payload["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    conn.send_bytes(json.dumps(payload).encode())
    conn.close()
