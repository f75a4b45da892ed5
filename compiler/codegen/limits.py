"""Per-block hardware limits of a target: the one table both the heuristic (a matmul
config shrunk until its pipelined tiles fit, `kinds/matmul.py`) and the tuner's pruning
(`tuner/space.py`) read, so neither chooses a config the other would reject."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.wire.keys import compute_capability


@dataclass(frozen=True)
class TargetLimits:
    """Per-block hardware limits that decide whether a config can launch at all."""

    shared_memory: int  # bytes of shared memory one block may use
    registers_per_thread: int
    registers_per_block: int
    max_threads: int
    # Upper bound on elements one block keeps live; the interpreter is slow past this.
    max_block_elements: int = 1 << 17


# Opt-in shared memory per block by compute capability (CUDA programming guide, "Technical
# Specifications per Compute Capability"); a capability not listed gets the 48 KiB every
# CUDA GPU allows without opting in.
SHARED_BY_CC = {(7, 0): 98304, (7, 5): 65536, (8, 0): 166912, (8, 6): 101376, (8, 7): 166912,
                (8, 9): 101376, (9, 0): 232448, (10, 0): 232448, (12, 0): 101376}
DEFAULT_SHARED = 49152
# An arch that names no compute capability (an empty one) is taken as an A100's.
DEFAULT_CC = (8, 0)
CPU_LIMITS = TargetLimits(
    shared_memory=1 << 20,
    registers_per_thread=255,
    registers_per_block=65536,
    max_threads=1024,
    max_block_elements=1 << 14,
)


def gpu_limits(arch: str) -> TargetLimits:
    """Limits of a CUDA GPU of class `arch` (`sm_90`, `sm_90a`, ...)."""
    cc = compute_capability(arch) or DEFAULT_CC
    return TargetLimits(
        shared_memory=SHARED_BY_CC.get(cc, DEFAULT_SHARED),
        registers_per_thread=255,
        registers_per_block=65536,
        max_threads=1024,
    )


def limits_for(target: Any) -> TargetLimits:
    """Limits of a `compiler.Target` (or anything with `device_type` and `arch`)."""
    if getattr(target, "device_type", "cpu") != "cuda":
        return CPU_LIMITS
    return gpu_limits(str(getattr(target, "arch", "")))
