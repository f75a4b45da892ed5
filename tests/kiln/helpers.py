"""Helpers for the client tests: tiny models trained through kiln or eagerly, warning
records, free ports."""

from __future__ import annotations

import re
import socket
import warnings
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from examples.models import GPT, GPTConfig, SeedMLP, gpt_batches, train
from kiln import KilnWarning, degrade, remote_compile, session

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


class ConvBN(nn.Module):
    """A convolution with batch norm (its running statistics are mutated inputs), an
    output that requires grad and one that does not."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        self.pool = nn.MaxPool2d(2)  # F.max_pool2d: a function made inside torch

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.pool(torch.relu(self.bn(self.conv(x)))).mean((2, 3))
        return self.fc(y), y.detach()


def step_outputs(model: nn.Module, x: torch.Tensor, compiled: bool) -> dict[str, list[torch.Tensor]]:
    """One training step's outputs, parameter gradients and buffers. The loss reads the
    first output transposed, so its gradient reaches the graph non-contiguous."""
    fn = torch.compile(model, backend=remote_compile) if compiled else model
    out, aside = fn(x)
    (out.t() @ torch.ones(out.shape[0], 3, device=out.device)).square().sum().backward()
    return {"outputs": [out.detach(), aside], "grads": [p.grad for p in model.parameters()],
            "buffers": list(model.buffers()),
            "requires_grad": [out.requires_grad, aside.requires_grad]}


def fresh_process() -> None:
    """What a new process starts with: no dynamo state, no counters (the disk stays)."""
    torch._dynamo.reset()
    degrade.reset()
    session.shutdown()


def assert_same_step(got: dict, want: dict, tol: float = 1e-5) -> None:
    assert got["requires_grad"] == want["requires_grad"]
    for name in ("outputs", "grads", "buffers"):
        for a, b in zip(got[name], want[name], strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
