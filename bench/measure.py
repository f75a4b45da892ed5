"""What the model benchmarks measure about a step, the same way everywhere.

- wall ms: `n` back-to-back steps with one synchronize at the end, per step, median of 3
  rounds (what a training loop sees, host overhead included);
- host ms: the median time a step call takes to return, the GPU left running (the launch
  work of the host; meaningful while the GPU queue does not fill);
- GPU ms: the device time of the kernels of one step, from the profiler;
- errors: relative L2 error against eager.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for `device`'s queue (nothing on the CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def wall_ms(step: Callable[[], Any], sync: Callable[[], None], n: int) -> float:
    """Median over 3 rounds of the wall time per step of `n` back-to-back steps."""
    rounds = []
    for _ in range(3):
        sync()
        start = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        rounds.append((time.perf_counter() - start) * 1000 / n)
    return statistics.median(rounds)


def host_ms(step: Callable[[], Any], sync: Callable[[], None], n: int) -> float:
    """Median time for a step call to return, the device left to run behind it."""
    times = []
    sync()
    for _ in range(n):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1000)
    sync()
    return statistics.median(times)


# Device rows the profiler adds about itself: CUPTI's buffer requests showed up to 2.4 ms in
# one kiln step's total and ~0.02 ms in Inductor's, so they would skew the comparison.
PROFILER_MARKERS = ("Activity Buffer Request",)

# Kernel names of layout conversions (cuDNN's and cuBLAS's transposes around a call).
LAYOUT_CONVERSIONS = ("nchwToNhwc", "nhwcToNchw")


def device_profile(step: Callable[[], Any], sync: Callable[[], None], n: int) -> dict[str, Any]:
    """What one step runs on the device (profiler, `n` steps): GPU ms, and per step the
    kernels, device-to-device copies and layout-conversion kernels (`gpu_ms` None and no
    counts without a GPU)."""
    if not torch.cuda.is_available():
        return {"gpu_ms": None}
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        sync()
    gpu_ms = gpu_ms_per_step([(e.key, e.self_device_time_total) for e in prof.key_averages()], n)
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"gpu_ms": gpu_ms, **device_counts(names, n)}


def gpu_ms_per_step(device_us: list[tuple[str, float]], n: int) -> float:
    """GPU ms a step from the profiler's (row, self device us) totals over `n` steps,
    without the profiler's own rows."""
    return sum(us for key, us in device_us if key not in PROFILER_MARKERS) / 1000 / n


def device_counts(names: list[str], n: int) -> dict[str, float]:
    """Per step, of the device activities named `names` over `n` steps: kernels (memcpys and
    memsets apart), device-to-device memcpys, copy kernels and layout conversions."""
    names = [name for name in names if name not in PROFILER_MARKERS]
    lower = [name.lower() for name in names]
    memcpy = sum("memcpy" in name and "dtod" in name for name in lower)
    copies = sum("copy" in name and "memcpy" not in name for name in lower)
    layout = sum(any(c in name for c in LAYOUT_CONVERSIONS) for name in names)
    kernels = sum("memcpy" not in name and "memset" not in name for name in lower)
    return {"kernels_per_step": kernels / n, "memcpy_dtod_per_step": memcpy / n,
            "copy_kernels_per_step": copies / n, "layout_conversions_per_step": layout / n}


def rel_error(got: Any, want: Any) -> float:
    """||got - want|| / ||want|| in float64."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def first_step(step: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    """Run the first step (compile included) to completion: its result and seconds."""
    sync()
    start = time.perf_counter()
    result = step()
    sync()
    return result, round(time.perf_counter() - start, 3)


@dataclass
class Reference:
    """Eager's result of one step and the gradients it left, one per parameter (None where
    a parameter got none)."""

    output: Any
    grads: list[torch.Tensor | None]

    @classmethod
    def of(cls, step: Callable[[], Any], module: nn.Module) -> Reference:
        output = step()
        return cls(output, [p.grad.clone() if p.grad is not None else None
                            for p in module.parameters()])

    def errors(self, got: Any, module: nn.Module) -> dict[str, float]:
        """`error_vs_eager` of a step's result and, after a training step,
        `max_grad_error_vs_eager` over the parameters' gradients."""
        found = {"error_vs_eager": rel_error(got, self.output)}
        pairs = [(p.grad, want) for p, want in zip(module.parameters(), self.grads, strict=True)
                 if p.grad is not None and want is not None]
        if pairs:
            found["max_grad_error_vs_eager"] = max(rel_error(g, w) for g, w in pairs)
        return found
