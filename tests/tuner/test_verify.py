"""Verification: wrong candidates are caught, right ones pass, in-place inputs and RNG restored."""

from __future__ import annotations

import pytest
import torch

from tuner.verify import Reference, mismatch


def softmax_scale(x: torch.Tensor) -> tuple[torch.Tensor]:
    return (torch.softmax(x * 0.125, -1),)


def test_wrong_candidate_is_caught_right_one_passes() -> None:
    ref = Reference.from_module(softmax_scale, [torch.randn(64, 128)])
    assert ref.check(softmax_scale) is None
    assert ref.check(lambda x: (torch.softmax(x * 0.15, -1),)) is not None  # wrong scale
    assert ref.check(lambda x: (torch.softmax(x.roll(1, 0) * 0.125, -1),)) is not None


def test_one_wrong_row_in_a_big_tensor_is_caught_in_bf16() -> None:
    x = torch.randn(1024, 256, dtype=torch.bfloat16)
    ref = Reference.from_module(lambda t: (t * 2,), [x])

    def one_row_off(t: torch.Tensor) -> tuple[torch.Tensor]:
        out = t * 2
        out[17] = 0
        return (out,)

    assert ref.check(one_row_off) is not None


@pytest.mark.parametrize(
    "dtype, noise, ok",
    [
        (torch.float32, 1e-5, True),
        (torch.float32, 1e-2, False),
        (torch.bfloat16, 4e-3, True),  # bf16 rounding
        (torch.bfloat16, 1e-1, False),
    ],
)
def test_tolerance_depends_on_dtype(dtype: torch.dtype, noise: float, ok: bool) -> None:
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(256, 256, generator=g).to(dtype)
    out = (ref.double() * (1 + noise * torch.randn(256, 256, generator=g, dtype=torch.float64))).to(
        dtype
    )
    assert (mismatch(out, ref) is None) is ok


def test_integer_outputs_must_match_exactly_and_nan_must_agree() -> None:
    a = torch.arange(10)
    b = a.clone()
    b[3] = 4
    assert mismatch(a, a.clone()) is None
    assert mismatch(b, a) is not None
    f = torch.tensor([1.0, float("nan"), float("inf")])
    assert mismatch(f.clone(), f) is None
    assert mismatch(torch.tensor([1.0, 2.0, float("inf")]), f) is not None
    assert mismatch(torch.tensor([1.0, float("nan"), -float("inf")]), f) is not None
    assert mismatch(torch.zeros(3), torch.zeros(4)) is not None
    assert mismatch(torch.zeros(3, dtype=torch.float64), torch.zeros(3)) is not None


def test_inputs_mutated_in_place_are_restored_between_runs() -> None:
    def add_into(buf: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
        buf.add_(x)  # the graph mutates its input (an optimizer-style update)
        return (buf * 1,)

    ref = Reference.from_module(add_into, [torch.ones(8), torch.full((8,), 2.0)])
    # Each check starts from the pristine buffer, so running twice still matches.
    assert ref.check(add_into) is None
    assert ref.check(add_into) is None
    # A candidate that forgets the in-place update returns the right value but leaves the input.
    assert "in-place" in ref.check(lambda buf, x: (buf + x,))


def test_random_ops_see_the_same_rng_state() -> None:
    def dropout(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.nn.functional.dropout(x, 0.5, training=True),)

    ref = Reference.from_module(dropout, [torch.randn(512)], seed=3)
    torch.manual_seed(99)  # anything in between must not matter
    assert ref.check(dropout) is None
    assert ref.check(dropout) is None


def test_more_accurate_than_eager_passes_against_the_float64_run() -> None:
    """Eager rounds x + 16 to bf16 before going back to fp32; a kernel that keeps fp32 is
    closer to the truth, and a float64 run of the graph shows it, so it is not 'wrong'."""

    def eager(x: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x + 16).float() - 16,)

    x = torch.randn(4096).to(torch.bfloat16)
    ref = Reference.from_module(eager, [x])
    assert ref.outputs64 is not None
    exact = lambda t: (t.float(),)  # noqa: E731
    assert mismatch(exact(x)[0], ref.outputs[0]) is not None  # the plain tolerance says no
    assert ref.check(exact) is None  # ...but it is closer to float64 than eager is
    assert ref.check(lambda t: (t.float() * 1.2,)) is not None  # wrong stays wrong

    def one_wrong_element(t: torch.Tensor) -> tuple[torch.Tensor]:
        out = t.float()
        out[7] += 5.0
        return (out,)

    assert ref.check(one_wrong_element) is not None


def _amplifying(scale: float, nudge: float):
    """A graph whose bf16 rounding is amplified (exp of a scaled value), and a 'heuristic
    build' that rounds one input differently: both legitimate, yet far apart."""

    def eager(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (((x * 1.1).to(torch.bfloat16).float() * scale).exp(),)

    def heuristic(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (((x * 1.1 * (1 + nudge)).to(torch.bfloat16).float() * scale).exp(),)

    return eager, heuristic


def test_heuristic_build_becomes_a_second_reference() -> None:
    torch.manual_seed(0)
    x = torch.randn(4096) * 0.002
    eager, heuristic = _amplifying(400.0, 2**-9)
    ref = Reference.from_module(eager, [x])
    assert ref.check(heuristic) is not None  # the plain tolerance misses (0.7% > 0.2%)
    assert ref.adopt_baseline(heuristic) is not None and ref.baseline is not None
    assert ref.check(heuristic) is None and ref.rule == "baseline"
    assert ref.check(lambda t: (heuristic(t)[0] * 1.05,)) is not None  # wrong stays wrong
    # A heuristic far from eager: its miss is recorded, and candidates must reproduce it
    # (tuning never makes the graph less right than the schedule clients already run).
    gross = Reference.from_module(eager, [x])

    def doubled(t: torch.Tensor) -> tuple[torch.Tensor]:
        return (heuristic(t)[0] * 2,)

    assert gross.adopt_baseline(doubled) is not None
    assert set(gross.baseline_misses) == {0} and "relative error" in gross.baseline_misses[0]
    assert gross.check(doubled) is None and gross.rule == "baseline"
    assert gross.check(lambda t: (doubled(t)[0] * 1.05,)) is not None


def _relu_mask(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.ops.aten.relu.default(x)
    return y, torch.ops.aten.le.Scalar(y, 0).view(-1)


def _traced(fn, *inputs: torch.Tensor):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(*inputs)


def test_a_mask_may_flip_only_where_its_input_is_within_rounding_of_the_threshold() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    x[0, :4] = torch.tensor([1e-4, -1e-4, 2.0, -2.0])
    ref = Reference.from_module(_traced(_relu_mask, x), [x])
    assert set(ref.slack) == {1}

    def flipped(positions: list[int]):
        def run(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y, mask = _relu_mask(t)
            mask = mask.clone()
            mask[positions] = ~mask[positions]
            return y, mask
        return run

    assert ref.check(flipped([0, 1])) is None and ref.rule == "threshold"  # +-1e-4: rounding
    assert "exact dtype" in ref.check(flipped([2]))  # 2.0 is nowhere near 0: a wrong mask
    assert "exact dtype" in ref.check(flipped([1, 2]))  # one legitimate flip, one wrong


def test_an_argmax_may_differ_only_between_ties() -> None:
    def pool(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2])

    x = torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(4))
    x[0, 0, 0, 0], x[0, 0, 0, 1] = 5.0, 5.0 - 1e-6  # a near tie in the first window
    ref = Reference.from_module(_traced(pool, x), [x])
    assert set(ref.slack) == {1}

    def picking(flat: int, index: int):
        def run(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            values, indices = pool(t)
            indices = indices.clone()
            indices.view(-1)[flat] = index
            return values, indices
        return run

    assert ref.outputs[1].view(-1)[0] == 0
    assert ref.check(picking(0, 1)) is None and ref.rule == "threshold"  # the tie's other side
    assert "exact dtype" in ref.check(picking(0, 4))  # another element of the window: not a tie


def test_low_precision_overflow_is_judged_against_float64() -> None:
    def square(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * x * 0.5,)  # fp16: x*x overflows before the halving does

    x = torch.tensor([300.0, 1.0, -2.0], dtype=torch.float16)
    ref = Reference.from_module(_traced(square, x), [x])
    assert torch.isinf(ref.outputs[0][0])  # eager overflowed; the true value fits fp16

    def in_fp32(t: torch.Tensor) -> tuple[torch.Tensor]:  # a fused kernel keeps fp32 inside
        return ((t.float() * t.float() * 0.5).to(torch.float16),)

    assert ref.check(in_fp32) is None and ref.rule == "float64"
    assert "infinities" in ref.check(lambda t: (torch.full_like(t, float("inf")),))


def test_rng_bookkeeping_outputs_are_reported_not_compared() -> None:
    from torch import fx

    from tuner.verify import unchecked_outputs

    graph = fx.Graph()
    q, k, v = (graph.placeholder(n) for n in "qkv")
    attn = graph.call_function(
        torch.ops.aten._scaled_dot_product_efficient_attention.default, (q, k, v, None, True)
    )
    outs = [graph.call_function(__import__("operator").getitem, (attn, i)) for i in range(4)]
    graph.output(tuple(outs))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    assert set(unchecked_outputs(gm)) == {2, 3}  # philox_seed, philox_offset

    def garbage_seed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, torch.randint(0, 1 << 30, ())

    ref = Reference.from_module(garbage_seed, [torch.randn(8)])
    ref.unchecked = {1: "aten.test.philox_seed"}
    assert ref.check(garbage_seed) is None
    assert ref.check(lambda x: (x * 3, torch.tensor(0))) is not None  # values still checked
