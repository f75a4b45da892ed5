"""Helpers of the op-level test matrix: trace a function, build it, compare with eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import compiler

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2),
       torch.float64: (1e-7, 1e-7)}


def trace(fn: Callable[..., Any], *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """The aten graph of `fn`, with kiln's decompositions (what AOTAutograd would give)."""
    return make_fx(fn, decomposition_table=compiler.decompositions())(*inputs)


def assert_matches(got: Any, want: Any, tol: tuple[float, float] | None = None) -> None:
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if not isinstance(w, torch.Tensor):
            assert g == w
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        atol, rtol = tol or TOL.get(w.dtype, (0, 0))
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)


def check(fn: Callable[..., Any], *inputs: torch.Tensor, tol: tuple[float, float] | None = None,
          lowered: bool = True, schedule: Any = None) -> compiler.Built:
    """Build `fn`'s graph (poisoned outputs) and compare a run with eager; returns the build.

    With `lowered`, also asserts that nothing ran as an ATen call.
    """
    gm = trace(fn, *inputs)
    built = compiler.build(gm, schedule, list(inputs))
    built.poison = True
    assert_matches(built(*inputs), fn(*inputs), tol)
    if lowered:
        assert built.fallback_ops == [], built.fallback_ops
        assert built.kernels, "expected at least one Triton kernel"
    return built


def rand(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, *, low: float = -3,
         high: float = 3, seed: int = 0) -> torch.Tensor:
    """Seeded values in [low, high) of any dtype (bools: about half true)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(int(low), int(high), shape, generator=g, dtype=dtype)
    return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)


def strided(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """A non-contiguous view with a storage offset holding `shape` (transposed and sliced)."""
    if len(shape) == 1:
        return rand((2 * shape[0] + 1,), dtype, seed=seed)[1::2]
    padded = tuple(s + 1 for s in shape)
    base = rand(tuple(reversed(padded)), dtype, seed=seed).permute(*reversed(range(len(shape))))
    view = base[tuple(slice(1, None) for _ in shape)]
    assert view.shape == shape and view.storage_offset() > 0
    return view


def layer_norm_backward(grad, x, mean, rstd, w, b):  # noqa: ANN001, ANN201
    """`native_layer_norm_backward` over the last dim, every gradient asked for."""
    return torch.ops.aten.native_layer_norm_backward(grad, x, [x.shape[-1]], mean, rstd, w, b,
                                                     [True, True, True])


def layer_norm_backward_inputs(shape: tuple[int, ...],
                               dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """Gradient, input (both of `shape`, normalised over the last dim), the input's float32
    mean and rstd (as a GPU's LayerNorm saves them for a bfloat16 input), weight and bias."""
    x = rand(shape, dtype, seed=1)
    mean = x.float().mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.float().var(-1, unbiased=False, keepdim=True) + 1e-5)
    return [rand(shape, dtype, seed=2), x, mean, rstd,
            rand(shape[-1:], dtype, seed=3), rand(shape[-1:], dtype, seed=4)]
