"""Helpers for the client tests: tiny models trained through kiln or eagerly, warning
records, free ports."""

from __future__ import annotations

import re
import socket
import warnings
from collections import Counter

import torch
import torch.nn.functional as F

from examples.models import GPT, GPTConfig, SeedMLP, gpt_batches, train
from kiln import KilnWarning

_CAUSE = re.compile(r"^kiln \[(\w+)\]")


def free_port() -> int:
    """A TCP port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def causes(caught: list[warnings.WarningMessage]) -> Counter[str]:
    """How many KilnWarnings were emitted per cause."""
    texts = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
    return Counter(m.group(1) for m in map(_CAUSE.match, texts) if m)


def train_mlp(steps: int = 5, backend: str | None = "kiln", batch: int = 8,
              options: dict | None = None) -> list[float]:
    """The seed MLP (narrowed: 16-32-10) trained `steps` SGD steps; returns the losses."""
    torch.manual_seed(0)
    model = SeedMLP(d_in=16, d_hidden=32, d_out=10)
    xs = [torch.randn(batch, 16) for _ in range(steps)]
    ys = [torch.randint(0, 10, (batch,)) for _ in range(steps)]
    fn = torch.compile(model, backend=backend, options=options) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        loss = F.cross_entropy(fn(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def train_gpt(steps: int = 5, backend: str | None = "kiln") -> list[float]:
    """The tiny GPT (1 layer, d=32, seq 8, batch 2) trained `steps` SGD steps."""
    cfg = GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg)
    batches = gpt_batches(cfg, batch=2, steps=steps)
    return train(torch.compile(model, backend=backend) if backend else model, batches)


def assert_close_losses(got: list[float], want: list[float], rtol: float = 1e-4) -> None:
    """The loss of every step matches within `rtol` (relative to max(1, |want|))."""
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert abs(g - w) <= rtol * max(1.0, abs(w)), f"step {step}: kiln {g} vs eager {w}"


def check_grads_per_batch(compiled, model: torch.nn.Module, batches: tuple[int, ...]) -> None:
    """For inputs of each batch size in turn, the compiled model's parameter gradients
    equal eager's (the shapes change, so a dynamic graph compiles per shape)."""
    for batch in batches:
        x = torch.randn(batch, 16)
        model.zero_grad()
        compiled(x).square().sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().sum().backward()
        for g, p in zip(got, model.parameters(), strict=True):
            torch.testing.assert_close(g, p.grad)
