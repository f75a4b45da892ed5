"""Op matrix: reductions in every variant, softmax-style graphs, against eager."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import compiler
from tests.compiler.oputil import TOL, assert_matches, check, rand, strided, trace

REDUCTIONS = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k), "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k), "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k), "std": lambda x, d, k: x.std(d, keepdim=k),
    "prod": lambda x, d, k: (x * 0.3 + 1).prod(d[0], keepdim=k),
    "argmax": lambda x, d, k: x.argmax(d[0], keepdim=k),
    "argmin": lambda x, d, k: x.argmin(d[0], keepdim=k),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
}
DIMS = [(-1,), (0,), (1,), (0, 2)]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_fp32(name: str, dims: tuple[int, ...], keepdim: bool) -> None:
    if name in ("prod", "argmax", "argmin") and len(dims) > 1:
        pytest.skip("single-dim op")
    fn = REDUCTIONS[name]
    check(lambda x: fn(x, dims, keepdim), rand((3, 5, 19), seed=1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "var"])
def test_reduction_half(name: str, dtype: torch.dtype) -> None:
    fn = REDUCTIONS[name]
    check(lambda x: fn(x, (-1,), False), strided((6, 33), dtype, seed=2))


@pytest.mark.parametrize("keepdim", [False, True])
def test_values_and_indices_reductions_share_a_kernel(keepdim: bool) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        top, where = torch.max(x, 1, keepdim=keepdim)
        low, at = torch.min(x, -1, keepdim=keepdim)
        return top, where, low, at

    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.5, -1.0, 7.0, -1.0], [2.0, 2.0, 2.0, 2.0]])
    built = check(fn, x)
    assert len(built.kernels) == 1


def test_reduction_all_dims_and_ints() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.sum(), x.amax(), i.sum(1), i.amax(0), b.any(1), b.all(0), b.sum(1), x.argmax())

    check(fn, rand((4, 9), seed=3), rand((4, 9), torch.int64, low=-9, high=9, seed=4),
          rand((4, 9), torch.bool, seed=5))


@pytest.mark.parametrize("shape", [(0, 7), (3, 0), (1, 1), (2, 1)])
def test_reduction_edge_sizes(shape: tuple[int, ...]) -> None:
    check(lambda x: (x.sum(-1), x.sum(0, keepdim=True), x.mean(-1)), rand(shape, seed=6))


def _variants(fn, *inputs, variants=("looped", "persistent", "online"), rblock=8,  # noqa: ANN001, ANN202
              poison=True):
    """Build with every reduction kernel forced to each variant (small RBLOCK: several
    loop iterations and ragged tails); every build must match eager. `poison` is the
    output fill (True: NaN; a number where NaN results are expected)."""
    gm = trace(fn, *inputs)
    base = compiler.heuristic_schedule(gm, None, list(inputs))
    want = fn(*inputs)
    for variant in variants:
        kernels = []
        for k in base.kernels:
            if k.kind == "reduction":
                r = k.sizes["rnumel"]
                block = max(1, 1 << (r - 1).bit_length()) if variant == "persistent" else rblock
                config = dict(k.config, RBLOCK=block, XBLOCK=2)
                k = dataclasses.replace(k, variant=variant, config=config)
            kernels.append(k)
        schedule = dataclasses.replace(base, kernels=tuple(kernels))
        built = compiler.build(gm, schedule, list(inputs))
        built.poison = poison
        assert_matches(built(*inputs), want, TOL.get(inputs[0].dtype))
        assert built.fallback_ops == []
    return built


def test_softmax_variants_one_kernel() -> None:
    built = _variants(lambda x: torch.softmax(x * 0.125, -1), rand((5, 37), seed=7))
    assert len(built.kernels) == 1


def test_log_softmax_and_layer_norm_variants() -> None:
    w, b = rand((37,), seed=8), rand((37,), seed=9)
    _variants(lambda x: torch.log_softmax(x, -1), rand((5, 37), seed=10))
    built = _variants(lambda x: F.gelu(F.layer_norm(x, (37,), w, b)) + x, rand((5, 37), seed=11))
    assert len(built.kernels) == 1


def test_cross_entropy_reads_logits_in_one_kernel() -> None:
    logits, target = rand((6, 41), seed=12), torch.tensor([0, 40, 7, 3, 3, 12])
    built = _variants(lambda x, y: F.cross_entropy(x, y), logits, target)
    assert sum(k.kind == "reduction" for k in built.kernels) == 2  # rows, then the batch mean


def test_rmsnorm_bf16_one_kernel() -> None:
    w = rand((64,), torch.bfloat16, seed=13)

    def rmsnorm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    built = check(rmsnorm, rand((8, 64), torch.bfloat16, seed=14))
    assert len(built.kernels) == 1


def test_column_reduction_of_strided_input() -> None:
    check(lambda x: (x.sum(0), x.amax(0, keepdim=True)), strided((33, 10), seed=15))


def test_bad_persistent_config_is_a_clear_error() -> None:
    x = rand((4, 100), seed=16)
    gm = trace(lambda x: x.sum(-1), x)
    s = compiler.heuristic_schedule(gm, None, [x])
    k = s.kernels[0]
    bad = s.with_kernel(k.name, variant="persistent", config=dict(k.config, RBLOCK=32))
    with pytest.raises(ValueError, match="RBLOCK"):
        compiler.build(gm, bad, [x])


# NaN follows torch: max/min are NaN when a reduced element is NaN, argmax/argmin give the
# first NaN's index, and softmax-style rows holding a NaN are NaN throughout. Outputs are
# poisoned with a finite value here, since a NaN fill would pass for a NaN result.
POISON = 1234.5


def _with_nans(shape: tuple[int, ...], where: list[tuple[int, ...]], seed: int) -> torch.Tensor:
    x = rand(shape, seed=seed)
    for at in where:
        x[at] = float("nan")
    return x


@pytest.mark.parametrize("variant", ["looped", "persistent"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_propagates_through_max_min_argmax_argmin(variant: str, dtype: torch.dtype) -> None:
    # rows: no NaN, one NaN late (a later loop iteration than the max), two NaNs in
    # different lanes (the later one in a lower lane: the first NaN must win), all NaN;
    # columns (dim 0) get NaNs too.
    x = _with_nans((4, 21), [(1, 17), (2, 12), (2, 3), (3, slice(None))], seed=20).to(dtype)
    x[0, 5] = 9.0  # a clear row maximum for the NaN-free row

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.amax(-1), x.amin(-1, keepdim=True), x.argmax(-1), x.argmin(-1),
                x.amax(0), x.argmax(0), torch.max(x), torch.min(x), x.argmax(),
                *torch.max(x, 1), *torch.min(x, 0, keepdim=True))

    want = fn(x)
    assert want[0][1].isnan() and int(want[2][2]) == 3 and not want[0][0].isnan()
    _variants(fn, x, variants=(variant,), rblock=8, poison=POISON)


def test_nan_row_max_with_infinities() -> None:
    # -inf and +inf next to a NaN: the NaN still wins; a row of -inf keeps -inf.
    x = torch.tensor([[float("-inf"), float("nan"), float("-inf")],
                      [float("inf"), 1.0, float("nan")],
                      [float("-inf"), float("-inf"), float("-inf")]])
    _variants(lambda x: (x.amax(-1), x.amin(-1), x.argmax(-1), x.argmin(-1)), x,
              variants=("looped", "persistent"), rblock=2, poison=POISON)


@pytest.mark.parametrize("variant", ["looped", "persistent", "online"])
def test_softmax_of_a_row_with_nan_is_nan(variant: str) -> None:
    # NaN in the first, a middle and the last loop iteration of different rows; row 3 is
    # clean and must stay finite. Row 4 is -inf but for one NaN: its max is NaN, not -inf.
    x = _with_nans((5, 37), [(0, 0), (1, 20), (2, 36)], seed=21)
    x[4] = float("-inf")
    x[4, 10] = float("nan")
    want = torch.softmax(x, -1)
    assert want[:3].isnan().all() and want[4].isnan().all() and not want[3].isnan().any()
    _variants(lambda x: torch.softmax(x, -1), x, variants=(variant,), poison=POISON)
    _variants(lambda x: torch.log_softmax(x, -1), x, variants=(variant,), poison=POISON)


@pytest.mark.parametrize("variant", ["looped", "persistent", "online"])
def test_softmax_max_output_is_nan_with_nan_rows(variant: str) -> None:
    # The online max itself (an output here, not only a step towards the sum) is NaN.
    x = _with_nans((3, 19), [(1, 15)], seed=22)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = x.amax(-1, keepdim=True)
        return m, torch.exp(x - m).sum(-1)

    _variants(fn, x, variants=(variant,), poison=POISON)


def test_cross_entropy_with_nan_logits_is_nan() -> None:
    logits = _with_nans((6, 41), [(2, 30)], seed=23)
    target = torch.tensor([0, 40, 7, 3, 3, 12])
    _variants(lambda x, y: F.cross_entropy(x, y, reduction="none"), logits, target, poison=POISON)
