"""The kernel suite (docs/benchmarks.md) for `python -m bench.suite`: nine cases, at the GPU
shape or the tiny CPU shape.

The models and inputs are `bench.cases`' (the one definition the coverage count and
the GPU check use too); this module adds what only the benchmark needs: a kind
label, whether a case trains (forward plus backward), and its roofline terms, the bytes
that must move once and the FLOPs that must be done.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.cases import CASE_NAMES, case

__all__ = ["CASE_NAMES", "Case", "make_case", "roofline_ms"]

_KINDS = {
    "seed_mlp": "tiny",
    "seed_matmul": "tiny matmul",
    "ln_gelu_residual": "reduction + pointwise",
    "softmax_rows": "reduction",
    "rmsnorm": "reduction",
    "linear_gelu": "matmul + epilogue",
    "cross_entropy": "reduction, int index",
    "gpt_block": "whole block",
    "gpt_block_train": "whole block",
}
_LAUNCH_BOUND = ("seed_mlp", "seed_matmul")


@dataclass
class Case:
    """One benchmark case, built for a device at full (GPU) or small (CPU) shape."""

    name: str
    kind: str
    module: nn.Module | Callable[..., Any]
    inputs: list[torch.Tensor]
    training: bool = False
    flops: float = 0.0
    launch_bound: bool = False

    def bytes_moved(self) -> float:
        """Bytes each input is read once and each output written once (forward only)."""
        with torch.no_grad():
            out = self.module(*self.inputs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        params = list(self.module.parameters()) if isinstance(self.module, nn.Module) else []
        tensors = [*self.inputs, *params, *[o for o in outs if isinstance(o, torch.Tensor)]]
        return float(sum(t.numel() * t.element_size() for t in tensors))


def _flops(name: str, inputs: list[torch.Tensor], module: nn.Module) -> float:
    """FLOPs that must be done (0 where the case is memory- or launch-bound)."""
    if name == "seed_mlp":
        return 2.0 * inputs[0].shape[0] * (128 * 256 + 256 * 10)
    if name == "seed_matmul":
        return 2.0 * inputs[0].shape[0] ** 3
    if name == "linear_gelu":
        m, k = inputs[0].shape
        return 2.0 * m * module.fc.out_features * k
    if name.startswith("gpt_block"):
        b, s, d = inputs[0].shape
        flops = 24.0 * d * d * b * s + 2.0 * b * s * s * d  # linears + causal attention
        return flops * 3 if name == "gpt_block_train" else flops
    return 0.0


def make_case(name: str, device: str, small: bool = False) -> Case:
    """Build case `name` on `device` (seeded); `small` gives the interpreter-sized shapes."""
    if name not in CASE_NAMES:
        raise ValueError(f"unknown case {name!r}; choose from {', '.join(CASE_NAMES)}")
    torch.manual_seed(0)
    dev = torch.device(device)
    bench = case(name, "tiny" if small else "full", rms_fp32=True)
    module, inputs = bench.make(dev)
    if name == "rmsnorm":  # a weight of ones would hide a kernel that skips the multiply
        with torch.no_grad():
            module.weight.copy_(1 + 0.1 * torch.randn(module.weight.shape[0], device=dev))
    if bench.train:
        inputs[0].requires_grad_(True)
    return Case(name, _KINDS[name], module, inputs, training=bench.train,
                flops=_flops(name, inputs, module), launch_bound=name in _LAUNCH_BOUND)


def roofline_ms(case: Case, copy_bytes_per_s: float, matmul_flops_per_s: float) -> float | None:
    """The floor: the larger of bytes / copy bandwidth and FLOPs / matmul rate (None if launch-bound)."""
    if case.launch_bound:
        return None
    bytes_term = case.bytes_moved() / copy_bytes_per_s * 1e3
    flops_term = case.flops / matmul_flops_per_s * 1e3 if case.flops else 0.0
    if case.training:
        bytes_term *= 2  # backward reads what forward wrote, at least once more
    return max(bytes_term, flops_term) if math.isfinite(bytes_term) else None
