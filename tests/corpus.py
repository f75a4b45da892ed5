"""The test corpus: small seeded models traced to aten graphs with kiln's decompositions.

`corpus()` returns, for every model, its inference graph (`fwd`, module in eval mode) and
its training graphs (`train_fwd`, `train_bwd`, module in train mode), each with the real
example inputs the graph receives. Shapes stay tiny: kernels run under the Triton
interpreter on the CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from bench.cases import GPTBlock, SeedMLP
from compiler.lowering.tracing import trace_inference, trace_training


@dataclass(frozen=True)
class CorpusCase:
    """One aten graph of the corpus and the inputs it was traced with."""

    name: str  # "<model>.<kind>", e.g. "mlp.train_bwd"
    gm: fx.GraphModule
    example_inputs: list[Any]
    kind: str  # "fwd" | "train_fwd" | "train_bwd"


class SmallConvNet(nn.Module):
    """Conv-BN-ReLU-MaxPool, Conv-BN-ReLU, global average pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class EmbeddingCrossEntropy(nn.Module):
    """Token embedding, linear to vocabulary logits, cross-entropy loss."""

    def __init__(self, vocab: int = 50, d: int = 16) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.emb(tokens))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class ViewsAndIndexing(nn.Module):
    """Views, permutes, slicing, cat, where, integer indexing and in-place ops."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 8))

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        y = x.permute(0, 2, 1) @ self.weight  # (4, 8, 6) @ (6, 8) -> (4, 8, 8)
        head, tail = y[:, :3, ::2], y[:, 3:, 1::2]
        z = torch.cat([head, tail.flip(1)], dim=1).reshape(4, -1)  # (4, 32)
        z = torch.where(z > 0, z, 0.1 * z)
        out = z[index].clone()  # integer indexing: rows picked by an int64 tensor
        out.mul_(2.0)
        out[:, 0] += 1.0
        wide = out.unsqueeze(0).expand(2, -1, -1).transpose(1, 2).contiguous()  # (2, 32, 5)
        wide.relu_()
        return wide.view(2, -1)[:, :7].sum(1) + out.t().sum(0)[:2]


@dataclass(frozen=True)
class _Model:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[], list[torch.Tensor]]


def _models() -> list[_Model]:
    return [
        _Model("mlp", SeedMLP, lambda: [torch.randn(4, 128)]),
        _Model("gpt_block", lambda: GPTBlock(32, 2, p_drop=0.1), lambda: [torch.randn(2, 8, 32)]),
        _Model("convnet", SmallConvNet, lambda: [torch.randn(2, 3, 8, 8)]),
        _Model(
            "embedding_ce",
            EmbeddingCrossEntropy,
            lambda: [torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))],
        ),
        _Model(
            "views_indexing",
            ViewsAndIndexing,
            lambda: [torch.randn(4, 6, 8), torch.tensor([2, 0, 3, 3, 1])],
        ),
    ]


def _trace(model: _Model, seed: int, device: str) -> list[CorpusCase]:
    torch.manual_seed(seed)
    module = model.make().to(device)
    inputs = [t.to(device) for t in model.inputs()]
    gm, fwd_inputs = trace_inference(module.eval(), inputs)
    cases = [CorpusCase(f"{model.name}.fwd", gm, fwd_inputs, "fwd")]
    fwd_gm, bwd_gm, train_inputs, bwd_inputs = trace_training(module.train(), inputs)
    cases.append(CorpusCase(f"{model.name}.train_fwd", fwd_gm, train_inputs, "train_fwd"))
    cases.append(CorpusCase(f"{model.name}.train_bwd", bwd_gm, bwd_inputs, "train_bwd"))
    return cases


@functools.cache
def _corpus(device: str) -> tuple[CorpusCase, ...]:
    return tuple(case for seed, model in enumerate(_models()) for case in _trace(model, seed, device))


def corpus(device: str = "cpu") -> list[CorpusCase]:
    """Every corpus graph, traced on `device` (once per process and device; treat the
    graphs as read-only)."""
    return list(_corpus(device))


KINDS = ("fwd", "train_fwd", "train_bwd")


def case_names() -> list[str]:
    """Names of every corpus case, without tracing anything (for test parametrisation)."""
    return [f"{model.name}.{kind}" for model in _models() for kind in KINDS]


def case(name: str) -> CorpusCase:
    """The corpus case called `name` (e.g. "gpt_block.train_bwd")."""
    for c in _corpus("cpu"):
        if c.name == name:
            return c
    raise KeyError(name)
