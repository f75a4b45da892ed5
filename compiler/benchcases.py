"""The BENCH.md cases as traceable modules, at full size or shrunk for the CPU.

Used by `python -m compiler.coverage` and `python -m compiler.gpu_check`; the tuner's
`python -m tuner.bench` is the full benchmark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class SeedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LnGeluResidual(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.ln(x)) + r


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LinearGelu(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x))


class GPTBlock(nn.Module):
    """Pre-norm block: LN, QKV, causal SDPA, projection, LN, MLP (4x, tanh-GELU).

    `p_drop` > 0 adds dropout after the projection and the MLP (random ops in training
    graphs); at 0 the block has no dropout module at all, so its graphs carry no random op.
    """

    def __init__(self, d: int, heads: int, p_drop: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p_drop) if p_drop else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, s, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


def _fn_module(fn: Callable[..., torch.Tensor]) -> nn.Module:
    class Fn(nn.Module):
        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return fn(*args)

    return Fn()


@dataclass(frozen=True)
class BenchCase:
    """One BENCH.md case: a module, its inputs, whether it is memory-bound, and whether
    the backward pass is part of it."""

    name: str
    make: Callable[[torch.device], tuple[nn.Module, list[torch.Tensor]]]
    memory_bound: bool
    train: bool = False
    bytes_moved: Callable[[list[torch.Tensor]], int] | None = None


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def cases(small: bool = False) -> list[BenchCase]:
    """The suite; `small` shrinks every size so the CPU interpreter can run it."""
    s = 16 if small else 1
    bf16 = torch.bfloat16

    def mlp(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        return SeedMLP().to(dev), [torch.randn(32, 128, device=dev)]

    def matmul(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        return _fn_module(torch.mm), [torch.randn(128, 128, device=dev), torch.randn(128, 128, device=dev)]

    def ln(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, n = 8192 // s, 4096 // s
        return (LnGeluResidual(n).to(dev, bf16),
                [torch.randn(m, n, device=dev, dtype=bf16), torch.randn(m, n, device=dev, dtype=bf16)])

    def softmax(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        return (_fn_module(lambda x: torch.softmax(x * 0.125, -1)),
                [torch.randn(16384 // s, 2048 // s, device=dev)])

    def rms(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, n = 8192 // s, 4096 // s
        return RMSNorm(n).to(dev, bf16), [torch.randn(m, n, device=dev, dtype=bf16)]

    def linear(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, n = 8192 // s, 4096 // s
        return LinearGelu(n, n).to(dev, bf16), [torch.randn(m, n, device=dev, dtype=bf16)]

    def ce(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, v = 8192 // s, 32000 // s
        return (_fn_module(lambda x, y: F.cross_entropy(x, y)),
                [torch.randn(m, v, device=dev, dtype=bf16), torch.randint(0, v, (m,), device=dev)])

    def gpt(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        d, h, b, seq = (1024 // s, 16 // (4 if small else 1), 8 // (4 if small else 1), 1024 // s)
        return GPTBlock(d, h).to(dev, bf16), [torch.randn(b, seq, d, device=dev, dtype=bf16)]

    return [
        BenchCase("seed_mlp", mlp, False),
        BenchCase("seed_matmul", matmul, False),
        BenchCase("ln_gelu_residual", ln, True, bytes_moved=lambda i: 3 * _nbytes(i[0])),
        BenchCase("softmax_rows", softmax, True, bytes_moved=lambda i: 2 * _nbytes(i[0])),
        BenchCase("rmsnorm", rms, True, bytes_moved=lambda i: 2 * _nbytes(i[0])),
        BenchCase("linear_gelu", linear, False),
        BenchCase("cross_entropy", ce, True, bytes_moved=lambda i: _nbytes(*i)),
        BenchCase("gpt_block", gpt, False),
        BenchCase("gpt_block_train", gpt, False, train=True),
    ]
