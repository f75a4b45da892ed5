"""Models used by the examples (and by the client tests): the seed MLP
(`bench.cases.SeedMLP`) and a small GPT built from the kernel suite's gpt_block
(`bench.cases.GPTBlock`, docs/benchmarks.md).

Deterministic given a seed; sizes are arguments so the CPU tests (Triton interpreter) can
keep them tiny while the GPU benchmark uses the suite's gpt_block shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# The kernel suite's gpt_block and the seed MLP, as the benchmarks and the compiler's corpus
# define them.
from bench.cases import GPTBlock as Block
from bench.cases import SeedMLP

__all__ = ["GPT", "Block", "GPTConfig", "SeedMLP", "gpt_batches", "not_through_kiln", "train",
           "verdict"]


def verdict(ok: bool) -> int:
    """Print kiln's stats and the example's verdict; the exit status. A run that matched
    eager but did not go through kiln fails (see `not_through_kiln`)."""
    import json

    import kiln

    stats = kiln.stats()
    print("stats:", json.dumps(stats, sort_keys=True))
    problem = not_through_kiln(stats)
    if problem:
        print(f"FAILED: {problem}")
        return 1
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


def not_through_kiln(stats: dict[str, float]) -> str | None:
    """Why a run did not go through kiln (`kiln.stats()` counts a graph run eagerly or no
    graph built), or None. The examples fail on it: matching eager's numbers proves nothing
    when eager is what ran."""
    if stats.get("eager", 0):
        hint = " (on a machine without a GPU, set TRITON_INTERPRET=1)" if \
            stats.get("fallback:cpu_eager", 0) else ""
        return (f"{int(stats['eager'])} graph(s) ran eagerly, not through kiln; see the "
                f"`kiln [cause]` warning above{hint}")
    if not stats.get("builds", 0):
        return "no graph was built by kiln (was torch.compile bypassed?)"
    return None


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the small GPT."""

    vocab: int = 64
    seq: int = 8
    d: int = 32
    heads: int = 2
    layers: int = 1
    dropout: float = 0.0


class GPT(nn.Module):
    """Token + position embeddings, `layers` blocks, final LN, LM head; returns the loss."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d)
        self.pos = nn.Embedding(cfg.seq, cfg.d)
        self.blocks = nn.ModuleList(Block(cfg.d, cfg.heads, cfg.dropout)
                                    for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt_batches(cfg: GPTConfig, batch: int, steps: int, seed: int = 0,
                device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` seeded (tokens, next-token targets) batches of a fixed, learnable pattern."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, cfg.vocab, (batch, 1), generator=g)
        seq = (start + torch.arange(cfg.seq + 1)) % cfg.vocab
        out.append((seq[:, :-1].to(device), seq[:, 1:].to(device)))
    return out


def train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
          lr: float = 1e-2) -> list[float]:
    """Plain SGD over `batches`; returns the loss of each step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for idx, targets in batches:
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
