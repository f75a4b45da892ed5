"""Op matrix: pointwise ops, each lowered to Triton and equal to eager (interpreter, CPU)."""

from __future__ import annotations

import pytest
import torch

from tests.compiler.oputil import TOL, check, rand, strided

FLOATS = [torch.float32, torch.float16, torch.bfloat16]

UNARY = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": lambda x: torch.log(x.abs() + 0.1),
    "log2": lambda x: torch.log2(x.abs() + 0.1), "log10": lambda x: torch.log10(x.abs() + 0.1),
    "log1p": lambda x: torch.log1p(x.abs()), "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5), "sin": torch.sin, "cos": torch.cos,
    "tan": lambda x: torch.tan(x * 0.3), "tanh": torch.tanh, "sinh": torch.sinh, "cosh": torch.cosh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "erfc": torch.erfc, "abs": torch.abs,
    "neg": torch.neg, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "trunc": torch.trunc, "frac": torch.frac, "reciprocal": lambda x: torch.reciprocal(x + 5),
    "relu": torch.relu, "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu, "sign": torch.sign, "square": torch.square,
    "leaky_relu": torch.nn.functional.leaky_relu, "elu": torch.nn.functional.elu,
    "hardtanh": torch.nn.functional.hardtanh, "softplus": torch.nn.functional.softplus,
    "mish": torch.nn.functional.mish, "hardswish": torch.nn.functional.hardswish,
    "asinh": torch.asinh, "atanh": lambda x: torch.atanh(x * 0.3),
}



def _one_arg(f):  # noqa: ANN001, ANN202 - make_fx traces every parameter of a callable
    return lambda x: f(x)


UNARY = {k: _one_arg(f) for k, f in UNARY.items()}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_fp32(name: str) -> None:
    check(UNARY[name], rand((37,), seed=1))


@pytest.mark.parametrize("dtype", FLOATS[1:])
@pytest.mark.parametrize("name", ["exp", "tanh", "gelu", "sigmoid", "rsqrt", "round"])
def test_unary_half(name: str, dtype: torch.dtype) -> None:
    check(UNARY[name], rand((5, 13), dtype, seed=2))


BINARY = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": torch.sub, "rsub": lambda a, b: torch.rsub(a, b, alpha=3), "mul": torch.mul,
    "div": torch.div, "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "where": lambda a, b: torch.where(a > b, a, b * 2),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcast_fp32(name: str) -> None:
    a = rand((3, 1, 7), seed=3)
    b = rand((5, 7), low=0.5, high=4, seed=4) * torch.where(rand((5, 7), seed=5) > 0, 1.0, -1.0)
    check(BINARY[name], a, b)


@pytest.mark.parametrize("dtype", FLOATS)
def test_chain_noncontiguous_offset(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x * 2 + y).to(torch.float32) - torch.relu(y) / 3

    # eager rounds every intermediate to `dtype`; kiln computes in fp32 and rounds once
    check(fn, strided((9, 17), dtype, seed=6), strided((9, 17), dtype, seed=7), tol=TOL[dtype])


INT_BINARY = {
    "add": torch.add, "mul": torch.mul, "floor_divide": torch.floor_divide,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_true": torch.div, "remainder": torch.remainder, "fmod": torch.fmod,
    "bitwise_and": torch.bitwise_and, "bitwise_xor": torch.bitwise_xor,
    "maximum": torch.maximum, "lt": torch.lt, "pow2": lambda a, b: a ** 2 + b,
}


@pytest.mark.parametrize("name", sorted(INT_BINARY))
def test_int64(name: str) -> None:
    a = rand((4, 11), torch.int64, low=-50, high=50, seed=8)
    b = rand((11,), torch.int64, low=1, high=9, seed=9) * torch.tensor([1, -1] * 5 + [1])
    check(INT_BINARY[name], a, b)


def test_bool_logic() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (a & b, a | ~b, torch.logical_xor(a, b), torch.logical_not(a),
                x.masked_fill(a, -1.0), a.to(torch.float32) + b)

    check(fn, rand((6, 5), torch.bool, seed=10), rand((6, 5), torch.bool, seed=11), rand((6, 5)))


@pytest.mark.parametrize("dst", [torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.float32])
def test_casts(dst: torch.dtype) -> None:
    check(lambda x: (x * 3).to(dst), rand((23,), seed=12))
    check(lambda x: (x + 1).to(dst), rand((23,), torch.int64, low=-5, high=5, seed=13))


def test_special_values() -> None:
    x = torch.tensor([0.0, -0.0, 1.5, -2.5, float("inf"), float("-inf"), float("nan"), 2.5, 0.5])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.isnan(x), torch.isinf(x), torch.isfinite(x), torch.nan_to_num(x),
                torch.signbit(x), torch.round(x), torch.clamp(x, -1, 1), torch.maximum(x, x * 0))

    check(fn, x)


def test_clamp_scalar_ops_and_generators() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.clamp(min=-0.5), x.clamp(max=0.25), torch.full_like(x, 7.0) * x,
                torch.zeros_like(x) + 1, x + torch.arange(x.shape[-1]), torch.ones(3, 1) * x)

    check(fn, rand((3, 10), seed=14))


@pytest.mark.parametrize("shape", [(0, 5), (1, 1), (1, 129), (130,), ()])
def test_edge_sizes(shape: tuple[int, ...]) -> None:
    check(lambda x, y: torch.exp(x) * y - 1, rand(shape, seed=15), rand(shape, seed=16))


def test_zero_dim_broadcast() -> None:
    check(lambda x, s: x * s + s, rand((4, 6), seed=17), torch.tensor(1.5))
