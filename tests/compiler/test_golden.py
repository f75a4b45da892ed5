"""Golden tests: the Triton source generated for a fixed set of graphs is pinned.

A change to code generation shows up as a diff of tests/compiler/golden/*.py; after
reviewing it, rewrite the files with `KILN_UPDATE_GOLDEN=1 pytest tests/compiler/test_golden.py`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import compiler
from tests.compiler.oputil import rand, trace

GOLDEN = Path(__file__).parent / "golden"


def _linear_relu() -> tuple[Callable, list[torch.Tensor]]:
    return (lambda x, w, b: torch.relu(F.linear(x, w, b)),
            [rand((8, 16), seed=1), rand((32, 16), seed=2), rand((32,), seed=3)])


def _layer_norm_gelu_residual() -> tuple[Callable, list[torch.Tensor]]:
    w, b = rand((64,), torch.bfloat16, seed=4), rand((64,), torch.bfloat16, seed=5)
    return (lambda x, r: F.gelu(F.layer_norm(x, (64,), w, b)) + r,
            [rand((8, 64), torch.bfloat16, seed=6), rand((8, 64), torch.bfloat16, seed=7)])


def _softmax_wide() -> tuple[Callable, list[torch.Tensor]]:
    return lambda x: torch.softmax(x * 0.125, -1), [rand((2, 5000), seed=8)]


def _cross_entropy() -> tuple[Callable, list[torch.Tensor]]:
    return (lambda x, y: F.cross_entropy(x, y),
            [rand((4, 10), torch.bfloat16, seed=9), torch.tensor([1, 0, 9, 3])])


def _views_pointwise() -> tuple[Callable, list[torch.Tensor]]:
    return (lambda x, y: torch.cat([x.t(), y[:, ::2]], dim=1).sigmoid() * 2,
            [rand((6, 4), seed=10), rand((4, 10), seed=11)])


def _bias_grad() -> tuple[Callable, list[torch.Tensor]]:
    return lambda g: g.sum(0), [rand((64, 12), seed=12)]


CASES = {f.__name__.lstrip("_"): f for f in (_linear_relu, _layer_norm_gelu_residual,
                                              _softmax_wide, _cross_entropy, _views_pointwise,
                                              _bias_grad)}


def render(name: str) -> dict[str, str]:
    """Golden file name -> text, one file per kernel of case `name` (heuristic schedule)."""
    fn, inputs = CASES[name]()
    gm = trace(fn, *inputs)
    built = compiler.build(gm, compiler.heuristic_schedule(gm, None, inputs), inputs)
    return {f"{name}_{i}.py": f"# golden: {name}, kernel {i} ({k.kind}, {k.variant})\n{k.source}"
            for i, k in enumerate(built.kernels)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_source(name: str) -> None:
    files = render(name)
    if os.environ.get("KILN_UPDATE_GOLDEN") == "1":
        for old in GOLDEN.glob(f"{name}_*.py"):
            old.unlink()
        for file, text in files.items():
            (GOLDEN / file).write_text(text)
    pinned = {p.name: p.read_text() for p in GOLDEN.glob(f"{name}_*.py")}
    assert pinned, f"no golden files for {name}; run with KILN_UPDATE_GOLDEN=1 to create them"
    assert files.keys() == pinned.keys(), "the number of kernels changed"
    for file, text in files.items():
        assert text == pinned[file], f"generated source {file} changed; review the diff, " \
            "then rewrite with KILN_UPDATE_GOLDEN=1"
