"""Split reductions (issue 13): reductions with few outputs and many reduced elements run as
two kernels, stage 1 into float32 partials with its prologue inlined, stage 2 over the
partials. Results against eager with the split forced at small (ragged) shapes, the size
rule, and the plans; `python -m tests.compiler.test_split_reductions` compiles the real
sizes for sm_90 without a GPU (run with the interpreter off; a test below does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import compiler
from compiler.ir import SPLIT_STAGE, TensorMeta, contiguous_strides
from compiler.lowering import frontend
from compiler.lowering.frontend import lower_graph
from compiler.lowering.split_reductions import ENV, SplitPolicy, plan_split, policy_from_env
from tests.compiler.oputil import (
    assert_matches,
    check,
    layer_norm_backward_inputs,
    rand,
    strided,
    trace,
)

aten = torch.ops.aten


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    """set(value) sets KILN_SPLIT_REDUCTIONS; lowerings cached under the other setting go."""
    def set_(value: str) -> None:
        monkeypatch.setenv(ENV, value)
        frontend._CACHE.clear()
    yield set_
    frontend._CACHE.clear()


def _meta(shape: tuple[int, ...], stride: tuple[int, ...] | None = None) -> TensorMeta:
    return TensorMeta(torch.bfloat16, shape, stride or contiguous_strides(shape))


def _cl(n: int, c: int, h: int, w: int) -> TensorMeta:
    return _meta((n, c, h, w), (h * w * c, 1, w * c, c))


# ---- the size rule ------------------------------------------------------------------------


def test_column_sum_over_many_rows_splits_rows_into_chunks() -> None:
    plan = plan_split(_meta((8192, 1024)), (0,), SplitPolicy())
    assert plan is not None and plan.outer == () and plan.split == (0, 64, 128)
    plan = plan_split(_meta((4096, 768)), (0,), SplitPolicy())
    assert plan.split == (0, 32, 128)  # 768 columns want 171 partials; chunks of >= 128 rows
    plan = plan_split(_meta((4096, 3072)), (0,), SplitPolicy())
    assert plan.split == (0, 32, 128)  # GPT-2's MLP bias gradient: 43 wanted, 32 divides 4096


def test_nchw_batch_norm_stage_one_reduces_each_image_plane() -> None:
    for c, hw in ((64, 56), (512, 7)):
        plan = plan_split(_meta((32, c, hw, hw)), (0, 2, 3), SplitPolicy())
        assert plan is not None and plan.outer == (0,) and plan.split is None


def test_channels_last_batch_norm_reads_rows_of_channels() -> None:
    plan = plan_split(_cl(32, 64, 56, 56), (0, 2, 3), SplitPolicy())
    assert plan.order == (0, 2, 3, 1) and plan.outer == (0,) and plan.split == (2, 8, 7)
    plan = plan_split(_cl(32, 512, 7, 7), (0, 2, 3), SplitPolicy())
    assert plan.order == (0, 2, 3, 1) and plan.outer == () and plan.split == (0, 16, 2)


def test_reductions_with_enough_outputs_or_few_elements_stay_one_kernel() -> None:
    policy = SplitPolicy()
    assert plan_split(_meta((8192, 1024)), (1,), policy) is None  # 8192 rows
    assert plan_split(_meta((512, 65536)), (0,), policy) is None  # 65536 columns
    assert plan_split(_meta((512, 64)), (0,), policy) is None  # 512 rows only
    assert plan_split(_meta((32, 2048, 7, 7)), (2, 3), policy) is None  # global pooling
    assert plan_split(_meta((2, 5000)), (1,), policy) is None  # short rows: one launch is less
    assert plan_split(_meta((8, 50304)), (1,), policy) is not None  # a long row's 8 programs
    assert plan_split(_meta((8192, 1024)), (0,), SplitPolicy(enabled=False)) is None


def test_a_full_reduction_splits_its_outer_dim() -> None:
    plan = plan_split(_meta((8192, 32000)), (0, 1), SplitPolicy())
    assert plan.outer == () and plan.split == (0, 256, 32)


def test_the_environment_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, want in (("auto", SplitPolicy()), ("off", SplitPolicy(enabled=False)),
                      ("6", SplitPolicy(force=6))):
        monkeypatch.setenv(ENV, raw)
        assert policy_from_env() == want
    for bad in ("1.5", "1", "lots"):
        monkeypatch.setenv(ENV, bad)
        if bad == "1":
            assert policy_from_env() == SplitPolicy()  # "1" reads as on
            continue
        with pytest.raises(ValueError, match=ENV):
            policy_from_env()


# ---- results against eager, split forced at small ragged shapes --------------------------


def _split_kernels(fn, *inputs) -> list[compiler.ir.KernelGroup]:  # noqa: ANN001
    program, _ = lower_graph(trace(fn, *inputs), list(inputs))
    return [k for k in program.kernels if any(m.meta.get(SPLIT_STAGE) for m in k.anchors)]


def _stages(groups: list) -> list[set[str]]:
    return [{m.meta[SPLIT_STAGE] for m in k.anchors if m.meta.get(SPLIT_STAGE)} for k in groups]


@pytest.mark.parametrize("rows", [37, 34, 48])  # prime, 2 * prime (padded), divisible
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gradient(split, rows: int, dtype: torch.dtype) -> None:
    split("8")
    x = rand((rows, 19), dtype, seed=1)
    built = check(lambda g: g.sum(0), x)
    assert len(built.kernels) == 2
    if dtype == torch.bfloat16:  # float32 partials, rounded once at the end
        assert ".to(tl.bfloat16)" not in built.kernels[0].source
        assert ".to(tl.bfloat16)" in built.kernels[1].source
    assert _stages(_split_kernels(lambda g: g.sum(0), x)) == [{"stage1"}, {"stage2"}]


def test_split_sums_are_deterministic(split) -> None:
    split("8")
    x = rand((61, 33), torch.bfloat16, seed=2)
    gm = trace(lambda g: g.sum(0), x)
    built = compiler.build(gm, None, [x])
    first = built(x)
    assert all(torch.equal(built(x), first) for _ in range(3))


def _column_stage1(groups: list) -> list:
    """Stage-1 kernels of column reductions: their domain keeps its innermost dim."""
    return [k for k in groups if _stages([k])[0] == {"stage1"}
            and len(k.domain.shape) - 1 not in k.domain.rdims]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_weight_and_bias_gradients(split, dtype: torch.dtype) -> None:
    split("4")
    c = 24

    def fn(dy, x, mean, rstd, w, b):  # noqa: ANN001, ANN202
        return aten.native_layer_norm_backward(dy, x, [c], mean, rstd, w, b, [True, True, True])

    x = rand((43, c), dtype, seed=4)
    mean = x.float().mean(1, keepdim=True)
    rstd = (x.float().var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    inputs = (rand((43, c), dtype, seed=3), x, mean, rstd, rand((c,), dtype, seed=5),
              rand((c,), dtype, seed=6))
    gm = trace(fn, *inputs)
    got = compiler.build(gm, None, list(inputs))(*inputs)
    # against float64: eager's bfloat16 CPU kernel is further from it than kiln is
    want = [t.to(r.dtype) for t, r in zip(fn(*[t.double() for t in inputs]), got, strict=True)]
    tol = (1e-4, 1e-4) if dtype == torch.float32 else (0.1, 2e-2)
    assert_matches(got, want, tol)
    groups = _column_stage1(_split_kernels(fn, *inputs))
    # stage 1: one kernel holds both column sums, with (x - mean) * rstd * dy inlined
    assert len(groups) == 1 and len(groups[0].anchors) == 2
    assert {"mul", "sub"} <= {n.target._opname for n in groups[0].inlined + groups[0].members
                              if hasattr(n.target, "_opname")}


def test_layer_norm_weight_gradient_prologue_is_never_stored(split) -> None:
    split("auto")
    rows, c = 2048, 8  # the rule splits: 8 columns over 2048 rows

    def fn(dy, x, mean, rstd):  # noqa: ANN001, ANN202
        return ((x - mean) * rstd * dy).sum(0), dy.sum(0)

    inputs = (rand((rows, c), seed=7), rand((rows, c), seed=8), rand((rows, 1), seed=9),
              rand((rows, 1), low=0.5, high=2, seed=10))
    built = check(fn, *inputs, tol=(1e-3, 1e-4))
    program, _ = lower_graph(trace(fn, *inputs), list(inputs))
    stored = [n for n in program.buffers if n.op == "call_function"
              and isinstance(n.meta.get("kiln_meta"), TensorMeta) and n.meta["kiln_meta"].numel >= rows * c]
    assert stored == []  # no [rows, c] value lives in memory: the prologue is inlined
    assert _stages(_split_kernels(fn, *inputs))[0] == {"stage1"}
    assert [k.kind for k in built.kernels] == ["reduction"] * len(built.kernels)


def _bn_forward(x, w, b, rm, rv):  # noqa: ANN001, ANN202
    return aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)


def _bn_backward(dy, x, w, mean, invstd):  # noqa: ANN001, ANN202
    return aten.native_batch_norm_backward(dy, x, w, None, None, mean, invstd, True, 1e-5,
                                           [True, True, True])


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("force", ["3", "auto"])
def test_batch_norm_training_forward_and_backward(split, layout: str, force: str) -> None:
    split(force)
    n, c, h, w = (5, 3, 7, 9) if force != "auto" else (8, 4, 16, 16)
    x = rand((n, c, h, w), seed=11)
    dy = rand((n, c, h, w), seed=12)
    if layout == "channels_last":
        x, dy = x.to(memory_format=torch.channels_last), dy.to(memory_format=torch.channels_last)
    weight, bias = rand((c,), seed=13), rand((c,), seed=14)
    rm, rv = rand((c,), seed=15), rand((c,), low=0.5, high=2, seed=16)
    check(_bn_forward, x, weight, bias, rm, rv, tol=(1e-4, 1e-4))
    mean, invstd = x.mean((0, 2, 3)), (x.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()
    check(_bn_backward, dy, x, weight, mean, invstd, tol=(1e-3, 1e-4))
    stages = _stages(_split_kernels(_bn_backward, dy, x, weight, mean, invstd))
    assert stages[0] == {"stage1"} and "stage2" in set().union(*stages[1:])


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "sum_f32"])
@pytest.mark.parametrize("dims", [(0,), (0, 2), (1,), (0, 1, 2)], ids=str)
def test_reductions_against_eager(split, name: str, dims: tuple[int, ...], keepdim: bool) -> None:
    split("5")
    fns = {"sum": lambda x: x.sum(dims, keepdim=keepdim), "mean": lambda x: x.mean(dims, keepdim=keepdim),
           "amax": lambda x: x.amax(dims, keepdim=keepdim), "amin": lambda x: x.amin(dims, keepdim=keepdim),
           "sum_f32": lambda x: x.sum(dims, keepdim=keepdim, dtype=torch.float32)}
    x = rand((13, 6, 11), torch.bfloat16, seed=17)
    check(fns[name], x, tol=(3e-2, 2e-2))
    assert _stages(_split_kernels(fns[name], x)) == [{"stage1"}, {"stage2"}]


@pytest.mark.parametrize("force", ["auto", "4"])
def test_transposed_and_offset_inputs(split, force: str) -> None:
    split(force)
    t = rand((19, 2048), seed=25).t()  # reduced dim innermost in memory: row regime
    built = check(lambda t: (t.sum(0), t.amax(0, keepdim=True)), t, tol=(1e-3, 1e-5))
    assert len(built.kernels) >= 2
    check(lambda v: v.mean((0, 2)), strided((33, 5, 7), seed=26), tol=(1e-5, 1e-5))


def test_var_std_and_var_mean_over_columns(split) -> None:
    split("6")
    x = rand((41, 10), seed=24)

    def fn(x):  # noqa: ANN001, ANN202
        return x.var(0), x.std(0, keepdim=True), *torch.var_mean(x, 0, correction=0)

    check(fn, x, tol=(1e-4, 1e-4))
    # two passes over x: every mean's stage 1 in one kernel, every sum of squares' in another
    # (the three identical keepdim means of the decompositions are split once)
    stages = _stages(_split_kernels(fn, x))
    assert stages.count({"stage1"}) == 2
    program, _ = lower_graph(trace(fn, x), [x])
    firsts = [m for k in program.kernels for m in k.anchors if m.meta.get(SPLIT_STAGE) == "stage1"]
    assert len(firsts) == 2 + 3  # means: keepdim and not; sums of squares: one per statistic


def test_max_keeps_nan_and_integers_split_too(split) -> None:
    split("4")
    x = rand((23, 7), seed=18)
    x[17, 3] = float("nan")
    check(lambda x: (x.amax(0), x.amin(0), x.max()), x)
    check(lambda i: (i.amax(0), i.sum(0)), rand((29, 5), torch.int32, low=-50, high=50, seed=19))


def test_full_reductions(split) -> None:
    split("auto")
    x = rand((128, 300), seed=20)
    built = check(lambda x: (x.sum(), x.mean()), x, tol=(1e-3, 1e-5))
    # both stage 1s share one kernel, and so do both stage 2s: their partials come from
    # the same kernel, which fusion counts as related
    assert len(built.kernels[0].nodes) == 2 and len(built.kernels) == 2


def _layer_norm_and_bias_backward(dy, x, mean, rstd, w, b, residual):  # noqa: ANN001, ANN202
    """A transformer block's LayerNorm backward over [batch, tokens, C], then the gradient of
    the bias of the linear layer that read its input's gradient (plus the residual)."""
    dx, dw, db = aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b,
                                                 [True, True, True])
    grad = dx + residual
    return grad, dw, db, grad.sum((0, 1))


def _layer_norm_inputs(batch: int, tokens: int, c: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """The LayerNorm backward's inputs over [batch, tokens, c], then the residual."""
    return [*layer_norm_backward_inputs((batch, tokens, c), dtype),
            rand((batch, tokens, c), dtype, seed=34)]


def test_adjacent_reduced_dims_are_one_dim_of_the_split(split) -> None:
    """[8, 512, 768] summed over (0, 1) is split as [4096, 768] summed over 0 (the bias
    gradient of the same tokens has the same first stage), and channels-last BatchNorm's
    (0, 2, 3) as [N * H * W, C]."""
    split("auto")
    inputs = _layer_norm_inputs(8, 512, 768, torch.bfloat16)  # GPT-2's 4096 tokens
    firsts = [k for k in _split_kernels(_layer_norm_and_bias_backward, *inputs)
              if _stages([k])[0] == {"stage1"}]
    assert [k.domain.shape for k in firsts] == [(32, 128, 768)]
    cl = rand((32, 64, 56, 56), torch.bfloat16).to(memory_format=torch.channels_last)
    (first, _) = _split_kernels(lambda x: x.sum((0, 2, 3)), cl)
    assert len(first.domain.shape) == 3 and first.domain.shape[-1] == 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layer_norms_column_sums_and_the_next_bias_gradient_share_two_kernels(
        split, dtype: torch.dtype) -> None:
    """Their first stages read nothing in common; they share a launch, and so do their
    second stages (whose partials then come from one kernel)."""
    split("auto")  # (forced, the rows' sums would split too)
    inputs = _layer_norm_inputs(4, 301, 16, dtype)  # 1204 rows: the column sums split
    gm = trace(_layer_norm_and_bias_backward, *inputs)
    got = compiler.build(gm, None, inputs)(*inputs)
    want = [t.to(r.dtype) for t, r in zip(_layer_norm_and_bias_backward(
        *[t.double() for t in inputs]), got, strict=True)]
    # bf16: 1204 gradients rounded to bf16 (the graph's output) before they are summed
    assert_matches(got, want, (1e-4, 1e-4) if dtype == torch.float32 else (0.5, 3e-2))
    groups = _split_kernels(_layer_norm_and_bias_backward, *inputs)
    assert _stages(groups) == [{"stage1"}, {"stage2"}]
    assert [len(k.anchors) for k in groups] == [3, 3]


def test_at_most_four_unrelated_first_stages_share_a_kernel(split) -> None:
    split("4")
    xs = [rand((37, 6), seed=40 + i) for i in range(6)]

    def sums(*xs):  # noqa: ANN002, ANN202
        return tuple(x.sum(0) for x in xs)

    check(sums, *xs, tol=(1e-4, 1e-5))
    firsts = [k for k in _split_kernels(sums, *xs) if _stages([k])[0] == {"stage1"}]
    assert sorted(len(k.anchors) for k in firsts) == [2, 4]


def test_off_keeps_one_kernel(split) -> None:
    split("off")
    assert len(check(lambda g: g.sum(0), rand((2048, 8), seed=21)).kernels) == 1
    split("auto")
    assert len(check(lambda g: g.sum(0), rand((2048, 8), seed=21)).kernels) == 2


def test_linear_bias_gradient_beside_its_weight_gradient(split) -> None:
    split("4")
    x, dy = rand((31, 12), seed=22), rand((31, 10), seed=23)
    built = check(lambda x, dy: (dy.t() @ x, dy.sum(0)), x, dy, tol=(1e-4, 1e-4))
    assert [k.kind for k in built.kernels].count("reduction") == 2


def test_training_graphs_through_the_wire_format(split) -> None:
    """AOTAutograd's graphs of Linear -> LayerNorm -> BatchNorm1d, encoded as kiln.graph/1 and
    built: at 2048 rows the size rule splits the weight and bias gradients' column sums
    and the BatchNorm statistics; every output matches the uncompiled graph."""
    from compiler.lowering.tracing import trace_training

    split("auto")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.LayerNorm(16),
                                 torch.nn.BatchNorm1d(16)).train()
    fwd, bwd, fi, bi = trace_training(module, [rand((2048, 12), seed=27)])
    for gm, inputs in ((fwd, fi), (bwd, bi)):
        graph = compiler.from_wire(compiler.to_wire(gm, inputs))
        built = compiler.build(graph)
        assert_matches(built(*inputs), gm(*inputs), (1e-3, 1e-3))
        program, _ = lower_graph(graph)
        assert any(m.meta.get(SPLIT_STAGE) == "stage1" for k in program.kernels for m in k.anchors)


# ---- real sizes compile for sm_90 -------------------------------------------------------


def _real_cases() -> dict[str, tuple]:
    bf = torch.bfloat16
    m = 8192, 1024

    def ln_bwd(dy, x, mean, rstd, w, b):  # noqa: ANN001, ANN202
        return aten.native_layer_norm_backward(dy, x, [m[1]], mean, rstd, w, b, [True, True, True])

    def meta(shape, cl=False, dtype=bf):  # noqa: ANN001, ANN202
        t = torch.empty(shape, dtype=dtype, device="meta")
        return t.to(memory_format=torch.channels_last) if cl else t

    f32 = torch.float32
    cases = {"ln_backward_8192x1024": (ln_bwd, meta(m), meta(m), meta((m[0], 1), dtype=f32),
                                       meta((m[0], 1), dtype=f32), meta((m[1],)), meta((m[1],))),
             "bias_grad_4096x2304": (lambda g: g.sum(0), meta((4096, 2304)))}
    for n, c, hw in ((32, 64, 56), (32, 512, 7)):
        for cl in (False, True):
            p = [meta((c,), dtype=f32) for _ in range(4)]
            name = f"bn_{n}x{c}x{hw}x{hw}{'_cl' if cl else ''}"
            cases[name + "_fwd"] = (_bn_forward, meta((n, c, hw, hw), cl), *p)
            cases[name + "_bwd"] = (_bn_backward, meta((n, c, hw, hw), cl), meta((n, c, hw, hw), cl),
                                    *p[:3])
    return cases


def _precompile_main() -> None:
    """Build each real-size case for an sm_90 target and compile every kernel with Triton for
    sm_90 (a stand-in driver; nothing launches). Prints one JSON line per case."""
    from tests.compiler.precompile_sm90 import build_for_sm90

    for name, (fn, *inputs) in _real_cases().items():
        schedule, _ = build_for_sm90(trace(fn, *inputs), inputs)
        print(json.dumps({"case": name, "kernels": [
            {"name": k.name, "variant": k.variant, "sizes": k.sizes, "config": k.config}
            for k in schedule.kernels]}), flush=True)


@pytest.mark.slow
def test_real_sizes_compile_for_sm90(tmp_path: Path) -> None:
    from tests.compiler.precompile_sm90 import run_module

    lines = run_module("tests.compiler.test_split_reductions", tmp_path, unset=(ENV,))
    cases = {c["case"]: c["kernels"] for c in map(json.loads, lines)}
    cubins = list((tmp_path / "triton").rglob("*.cubin"))
    assert len(cubins) >= sum(map(len, cases.values())) // 2  # kernels compiled for sm_90
    assert set(cases) == set(_real_cases())
    ln = cases["ln_backward_8192x1024"]
    assert {"xnumel": 65536, "rnumel": 128} in [k["sizes"] for k in ln]  # stage 1: 64 x 1024 partials
    bn = cases["bn_32x64x56x56_bwd"]
    assert {"xnumel": 2048, "rnumel": 3136} in [k["sizes"] for k in bn]  # [N, C] partials


if __name__ == "__main__":
    _precompile_main()
