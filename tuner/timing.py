"""Timing as docs/benchmarks.md's "How" says: warm-up, L2 flushed, CUDA events, median of
many, a noise band.

On a GPU `triton.testing.do_bench` does the work (it flushes L2 between repeats and times
each with CUDA events). On the CPU, kernels run in the Triton interpreter: the clock is
the host's and the numbers are only good for exercising the code path, never for speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Two times closer than this fraction are a tie even when the repeats agree better.
MIN_NOISE_FRACTION = 0.01


@dataclass(frozen=True)
class Timing:
    """Median time of many repeats and the half-width of their middle spread (both ms)."""

    median_ms: float
    noise_ms: float
    repeats: int


def time_cuda(fn: Callable[[], object], warmup_ms: float = 10.0, rep_ms: float = 40.0) -> Timing:
    """Median of CUDA-event timed repeats of `fn`, L2 flushed before each (do_bench)."""
    import torch
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    q20, q50, q80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
    # do_bench's repeat count: rep_ms over the estimated time per call, at least one.
    repeats = max(1, int(rep_ms / max(q50, 1e-6)))
    return Timing(float(q50), float(q80 - q20) / 2, repeats)


def time_host(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> Timing:
    """Median wall-clock time of `fn` on the host (CPU / Triton interpreter)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    median = statistics.median(samples)
    lo = samples[len(samples) // 5]
    hi = samples[-1 - len(samples) // 5]
    return Timing(median, (hi - lo) / 2, len(samples))


def time_fn(
    fn: Callable[[], object], device: str, fidelity: float = 1.0, host_repeats: int = 3
) -> Timing:
    """Time `fn` on `device` ("cpu" or "cuda[:N]"); `fidelity` scales the repeat budget."""
    if device.startswith("cuda"):
        return time_cuda(fn, warmup_ms=10.0 * fidelity, rep_ms=40.0 * fidelity)
    return time_host(fn, repeats=max(1, round(host_repeats * fidelity)))


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read plus bytes written)."""
    import torch

    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    timing = time_fn(lambda: dst.copy_(src), device)
    return 2 * nbytes / (timing.median_ms * 1e-3)


def matmul_rate(device: str, n: int = 8192) -> float:
    """Measured bf16 n^3 matmul rate in FLOP/s, on random data (zeros run faster)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    timing = time_fn(lambda: a @ b, device)
    return 2 * n**3 / (timing.median_ms * 1e-3)
