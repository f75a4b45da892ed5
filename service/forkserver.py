"""The warm servers the service forks its children from (`compiler.child.ForkServer`).

Each has kiln, torch and Triton imported, so a forked child starts in milliseconds with
them loaded, and no thread of the API or the worker is forked. Two, because Triton reads
TRITON_INTERPRET when it is imported:

- `checks`: the environment of this process (the CPU worker's and `kiln serve`'s turn the
  interpreter on): request intake (`service.intake_child`) and the builds of CPU targets,
  whose kernels are checked on the Triton interpreter.
- `compiles`: the interpreter off: the builds of CUDA targets, which compile every kernel
  for the target in the same child (`service.build_child`), and the compile of a tuned
  schedule (`service.target_compile.compile_schedule`).

A server starts on first use (or `warm`) and ends when this process does: it reads the end
of its channel, then kills whatever it forked that is still running. `shutdown` ends both
now (the service stopping).
"""

from __future__ import annotations

import threading

from compiler.child import ForkServer

PRELOAD = ["service.pipeline", "compiler.lowering.frontend", "compiler.scheduling.heuristics",
           "compiler.runtime.built", "compiler.wire.graph", "compiler.wire.plan", "tuner.verify",
           "triton.language", "torch._dynamo", "service.intake_child", "service.build_child"]

checks = ForkServer(PRELOAD, name="kiln fork server")
compiles = ForkServer([*PRELOAD, "tuner.aot", "service.target_compile:warm_up"],
                      env={"TRITON_INTERPRET": "0"}, name="kiln compiling fork server")


def for_target(target_json: dict) -> ForkServer:
    """The server a build for this target forks from."""
    return compiles if target_json.get("device_type") == "cuda" else checks


def shutdown() -> None:
    """End both servers and their children (started again on next use), side by side:
    each waits for its server's process to end."""
    ending = threading.Thread(target=compiles.close, name="kiln-forkserver-close")
    ending.start()
    checks.close()
    ending.join()
