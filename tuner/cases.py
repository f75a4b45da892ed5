"""The BENCH.md suite: nine cases, each at its GPU shape and at a small shape for the CPU.

A case gives a module (or function), its example inputs, whether it trains (forward plus
backward), and its roofline terms: bytes that must move once and FLOPs that must be done.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


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


class SeedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(128, 256), nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class LNGeluResidual(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.ln(x)) + r


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            x
            * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)
            * self.weight
        )


class LinearGelu(nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x))


class GPTBlock(nn.Module):
    """Pre-LN transformer block: causal SDPA attention and a 4x tanh-GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


def _softmax_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 0.125, -1)


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


CASE_NAMES = (
    "seed_mlp",
    "seed_matmul",
    "ln_gelu_residual",
    "softmax_rows",
    "rmsnorm",
    "linear_gelu",
    "cross_entropy",
    "gpt_block",
    "gpt_block_train",
)


def make_case(name: str, device: str, small: bool = False) -> Case:
    """Build case `name` on `device`; `small` gives the interpreter-sized shapes."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    dev = torch.device(device)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dtype)

    if name == "seed_mlp":
        batch = 4 if small else 32
        mod = SeedMLP().to(dev)
        flops = 2 * batch * (128 * 256 + 256 * 10)
        return Case(name, "tiny", mod, [randn(batch, 128)], flops=flops, launch_bound=True)
    if name == "seed_matmul":
        n = 16 if small else 128
        return Case(
            name,
            "tiny matmul",
            _matmul,
            [randn(n, n), randn(n, n)],
            flops=2 * n**3,
            launch_bound=True,
        )
    if name == "ln_gelu_residual":
        m, d = (16, 64) if small else (8192, 4096)
        mod = LNGeluResidual(d).to(dev, bf16)
        return Case(
            name, "reduction + pointwise", mod, [randn(m, d, dtype=bf16), randn(m, d, dtype=bf16)]
        )
    if name == "softmax_rows":
        m, n = (16, 128) if small else (16384, 2048)
        return Case(name, "reduction", _softmax_rows, [randn(m, n)])
    if name == "rmsnorm":
        m, d = (16, 64) if small else (8192, 4096)
        mod = RMSNorm(d).to(dev, bf16)
        with torch.no_grad():
            mod.weight.copy_(1 + 0.1 * torch.randn(d, device=dev))
        return Case(name, "reduction", mod, [randn(m, d, dtype=bf16)])
    if name == "linear_gelu":
        m, k, n = (16, 32, 32) if small else (8192, 4096, 4096)
        mod = LinearGelu(k, n).to(dev, bf16)
        return Case(
            name, "matmul + epilogue", mod, [randn(m, k, dtype=bf16)], flops=2.0 * m * n * k
        )
    if name == "cross_entropy":
        m, v = (16, 100) if small else (8192, 32000)
        y = torch.randint(0, v, (m,), device=dev)
        return Case(name, "reduction, int index", _cross_entropy, [randn(m, v, dtype=bf16), y])
    if name in ("gpt_block", "gpt_block_train"):
        b, s, d, h = (1, 16, 32, 2) if small else (8, 1024, 1024, 16)
        mod = GPTBlock(d, h).to(dev, bf16)
        x = randn(b, s, d, dtype=bf16)
        tokens = b * s
        flops = 24.0 * d * d * tokens + 2.0 * b * s * s * d  # linears + causal attention
        training = name == "gpt_block_train"
        if training:
            x.requires_grad_(True)
            flops *= 3
        return Case(name, "whole block", mod, [x], training=training, flops=flops)
    raise ValueError(f"unknown case {name!r}; choose from {', '.join(CASE_NAMES)}")


def roofline_ms(case: Case, copy_bytes_per_s: float, matmul_flops_per_s: float) -> float | None:
    """The floor: the larger of bytes / copy bandwidth and FLOPs / matmul rate (None if launch-bound)."""
    if case.launch_bound:
        return None
    bytes_term = case.bytes_moved() / copy_bytes_per_s * 1e3
    flops_term = case.flops / matmul_flops_per_s * 1e3 if case.flops else 0.0
    if case.training:
        bytes_term *= 2  # backward reads what forward wrote, at least once more
    return max(bytes_term, flops_term) if math.isfinite(bytes_term) else None
