"""The kernel suite's cases (docs/benchmarks.md) as traceable modules with their inputs, at
full size or shrunk for the CPU.

The one definition of the suite's models and inputs: `python -m bench.coverage` and
`python -m bench.gpu_check` use it directly, `python -m bench.suite` (the full benchmark)
builds its cases on it, adding its roofline terms, and the test corpus and the examples
take their models from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn


class SeedMLP(nn.Module):
    """The seed model: Linear(128,256)-ReLU-Linear(256,10); the examples' CPU tests pass
    smaller sizes."""

    def __init__(self, d_in: int = 128, d_hidden: int = 256, d_out: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(),
                                 nn.Linear(d_hidden, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LnGeluResidual(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.ln(x)) + r


class RMSNorm(nn.Module):
    """RMS norm; `fp32_stats` computes the mean square and rsqrt in float32 (then casts
    back), as bf16 models usually do, instead of in the input's dtype."""

    def __init__(self, d: int, eps: float = 1e-6, fp32_stats: bool = False) -> None:
        super().__init__()
        self.weight, self.eps, self.fp32_stats = nn.Parameter(torch.ones(d)), eps, fp32_stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp32_stats:
            scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)
            return x * scale * self.weight
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
    """One kernel suite case: a module, its inputs, whether it is memory-bound, and whether
    the backward pass is part of it."""

    name: str
    make: Callable[[torch.device], tuple[nn.Module, list[torch.Tensor]]]
    memory_bound: bool
    train: bool = False
    bytes_moved: Callable[[list[torch.Tensor]], int] | None = None


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


_LN = {"full": {"m": 8192, "d": 4096}, "small": {"m": 512, "d": 256}, "tiny": {"m": 16, "d": 64}}
_GPT = {"full": {"b": 8, "s": 1024, "d": 1024, "h": 16}, "small": {"b": 2, "s": 64, "d": 64, "h": 4},
        "tiny": {"b": 1, "s": 16, "d": 32, "h": 2}}

# Case -> scale -> sizes. "full": the suite's GPU shapes; "small": about 1/16 of them, for the
# interpreter (`bench.coverage`, `bench.gpu_check --small`); "tiny": smaller still, for
# `python -m bench.suite --device cpu`, which builds and runs every tuning candidate.
DIMS: dict[str, dict[str, dict[str, int]]] = {
    "seed_mlp": {"full": {"batch": 32}, "small": {"batch": 32}, "tiny": {"batch": 4}},
    "seed_matmul": {"full": {"n": 128}, "small": {"n": 128}, "tiny": {"n": 16}},
    "ln_gelu_residual": _LN,
    "softmax_rows": {"full": {"m": 16384, "n": 2048}, "small": {"m": 1024, "n": 128},
                     "tiny": {"m": 16, "n": 128}},
    "rmsnorm": _LN,
    "linear_gelu": {"full": {"m": 8192, "k": 4096, "n": 4096},
                    "small": {"m": 512, "k": 256, "n": 256}, "tiny": {"m": 16, "k": 32, "n": 32}},
    "cross_entropy": {"full": {"m": 8192, "v": 32000}, "small": {"m": 512, "v": 2000},
                      "tiny": {"m": 16, "v": 100}},
    "gpt_block": _GPT,
    "gpt_block_train": _GPT,
}
CASE_NAMES = tuple(DIMS)
SCALES = ("full", "small", "tiny")

_Make = Callable[[torch.device], tuple[nn.Module, list[torch.Tensor]]]


def _makers(dims: dict[str, dict[str, int]], rms_fp32: bool) -> dict[str, _Make]:
    """Each case's `make(device)` at the given sizes: the module first, then its inputs
    (drawn from the global RNG in that order, so a seed fixes both)."""
    bf16 = torch.bfloat16

    def randn(dev: torch.device, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dtype)

    def mlp(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        return SeedMLP().to(dev), [randn(dev, dims["seed_mlp"]["batch"], 128)]

    def matmul(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        n = dims["seed_matmul"]["n"]
        return _fn_module(torch.mm), [randn(dev, n, n), randn(dev, n, n)]

    def ln(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, n = dims["ln_gelu_residual"]["m"], dims["ln_gelu_residual"]["d"]
        return (LnGeluResidual(n).to(dev, bf16),
                [randn(dev, m, n, dtype=bf16), randn(dev, m, n, dtype=bf16)])

    def softmax(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, n = dims["softmax_rows"]["m"], dims["softmax_rows"]["n"]
        return _fn_module(lambda x: torch.softmax(x * 0.125, -1)), [randn(dev, m, n)]

    def rms(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, n = dims["rmsnorm"]["m"], dims["rmsnorm"]["d"]
        return RMSNorm(n, fp32_stats=rms_fp32).to(dev, bf16), [randn(dev, m, n, dtype=bf16)]

    def linear(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, k, n = (dims["linear_gelu"][x] for x in ("m", "k", "n"))
        return LinearGelu(k, n).to(dev, bf16), [randn(dev, m, k, dtype=bf16)]

    def ce(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        m, v = dims["cross_entropy"]["m"], dims["cross_entropy"]["v"]
        return (_fn_module(lambda x, y: F.cross_entropy(x, y)),
                [randn(dev, m, v, dtype=bf16), torch.randint(0, v, (m,), device=dev)])

    def gpt(dev: torch.device) -> tuple[nn.Module, list[torch.Tensor]]:
        b, seq, d, h = (dims["gpt_block"][x] for x in ("b", "s", "d", "h"))
        return GPTBlock(d, h).to(dev, bf16), [randn(dev, b, seq, d, dtype=bf16)]

    return {"seed_mlp": mlp, "seed_matmul": matmul, "ln_gelu_residual": ln,
            "softmax_rows": softmax, "rmsnorm": rms, "linear_gelu": linear,
            "cross_entropy": ce, "gpt_block": gpt, "gpt_block_train": gpt}


def cases(small: bool = False, scale: str | None = None, rms_fp32: bool = False) -> list[BenchCase]:
    """The suite at `scale` (one of SCALES; default "small" when `small`, else "full").
    `rms_fp32` builds rmsnorm with float32 statistics (the tuner's bench does)."""
    scale = scale or ("small" if small else "full")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
    make = _makers({name: sizes[scale] for name, sizes in DIMS.items()}, rms_fp32)
    return [
        BenchCase("seed_mlp", make["seed_mlp"], False),
        BenchCase("seed_matmul", make["seed_matmul"], False),
        BenchCase("ln_gelu_residual", make["ln_gelu_residual"], True,
                  bytes_moved=lambda i: 3 * _nbytes(i[0])),
        BenchCase("softmax_rows", make["softmax_rows"], True, bytes_moved=lambda i: 2 * _nbytes(i[0])),
        BenchCase("rmsnorm", make["rmsnorm"], True, bytes_moved=lambda i: 2 * _nbytes(i[0])),
        BenchCase("linear_gelu", make["linear_gelu"], False),
        BenchCase("cross_entropy", make["cross_entropy"], True, bytes_moved=lambda i: _nbytes(*i)),
        BenchCase("gpt_block", make["gpt_block"], False),
        BenchCase("gpt_block_train", make["gpt_block_train"], False, train=True),
    ]


def case(name: str, scale: str = "full", rms_fp32: bool = False) -> BenchCase:
    """One case of `cases(scale=scale, rms_fp32=rms_fp32)` by name."""
    for found in cases(scale=scale, rms_fp32=rms_fp32):
        if found.name == name:
            return found
    raise ValueError(f"unknown case {name!r}; choose from {', '.join(CASE_NAMES)}")


def traced_graphs(scale: str) -> Iterator[tuple[str, fx.GraphModule, list[torch.Tensor]]]:
    """Every case's aten graphs at `scale` on the CPU (seeded), as (name, graph, inputs):
    `<case>` for an inference case, `<case>.fwd` and `<case>.bwd` for a training one."""
    from compiler.lowering.tracing import trace_inference, trace_training

    for case in cases(scale=scale):
        torch.manual_seed(0)
        module, inputs = case.make(torch.device("cpu"))
        if case.train:
            for p in module.parameters():
                p.requires_grad_(True)
            fwd, bwd, fi, bi = trace_training(module, inputs)
            yield f"{case.name}.fwd", fwd, fi
            yield f"{case.name}.bwd", bwd, bi
        else:
            gm, gi = trace_inference(module.eval(), inputs)
            yield case.name, gm, gi
