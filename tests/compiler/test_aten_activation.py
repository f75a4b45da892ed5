"""An addmm whose only use is a ReLU or a tanh-GELU runs as one library call with that
activation (`compiler/codegen/kinds/aten_activation.py`, variant `aten_act`): which
epilogues qualify, the heuristic on a GPU target, the schedule round trip, the tuner's
space, and the numbers (interpreter: the call's CPU path)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.codegen import kinds
from compiler.codegen.kinds.aten_activation import activation_of
from compiler.lowering.frontend import lower_graph
from compiler.runtime.library_calls import AddmmActivation
from compiler.scheduling.schedule import Schedule
from tests.compiler.oputil import assert_matches, rand, trace
from tuner.space import raw_space

H200 = {"device_type": "cuda", "arch": "sm_90"}
MM_TOL = (1e-4, 1e-4)


def _gelu_new(h: torch.Tensor) -> torch.Tensor:  # Hugging Face GPT-2's spelling
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


EPILOGUES = {
    "gelu_new": (_gelu_new, "gelu_tanh"),
    "gelu_tanh": (lambda h: F.gelu(h, approximate="tanh"), "gelu_tanh"),
    "relu": (torch.relu, "relu"),
    "gelu_erf": (F.gelu, None),
    "silu": (F.silu, None),
    "relu_plus_one": (lambda h: torch.relu(h) + 1, None),
    "leaky_relu": (lambda h: F.leaky_relu(h, 0.01), None),
}


def _inputs(m: int = 4096, k: int = 768, n: int = 3072) -> list[torch.Tensor]:
    return [rand((m, k), seed=1), rand((n, k), seed=2), rand((n,), seed=3)]


def _mlp(act):  # noqa: ANN001, ANN202
    return lambda x, w, b: act(F.linear(x, w, b))


@pytest.mark.parametrize("name", list(EPILOGUES))
def test_only_relu_and_the_tanh_gelu_of_the_product_alone_qualify(name: str) -> None:
    act, want = EPILOGUES[name]
    inputs = _inputs()  # cuBLAS-sized: the heuristic gives the library call
    program, _ = lower_graph(trace(_mlp(act), *inputs), inputs)
    (group,) = program.kernels
    found = activation_of(group)
    assert (found and found[0]) == want
    variant, _ = kinds.heuristic(group, True, "sm_90")
    assert variant == ("aten_act" if want else "aten")
    assert kinds.heuristic(group, False)[0] == "triton", "never on the CPU"


def test_an_epilogue_is_probed_once_however_often_it_is_asked_and_others_stay_apart(
        monkeypatch) -> None:
    from compiler.codegen.kinds import aten_activation

    monkeypatch.setattr(aten_activation, "_MATCHED", {})
    probes = []
    real = aten_activation._probe
    monkeypatch.setattr(aten_activation, "_probe", lambda *a: probes.append(1) or real(*a))
    inputs = _inputs(64, 32, 48)
    twice = _mlp(lambda h: F.gelu(F.gelu(h, approximate="tanh") - 1, approximate="tanh"))
    found = []
    for name in ("gelu_tanh", "gelu_erf", "gelu_tanh", "relu"):
        act = EPILOGUES[name][0]
        program, _ = lower_graph(trace(_mlp(act), *inputs), inputs)
        (group,) = program.kernels
        found += [activation_of(group), activation_of(group)]
    program, _ = lower_graph(trace(twice, *inputs), inputs)
    found.append(activation_of(program.kernels[0]))
    assert [f and f[0] for f in found] == [
        "gelu_tanh", "gelu_tanh", None, None, "gelu_tanh", "gelu_tanh", "relu", "relu", None]
    assert len(probes) == 4  # tanh-GELU, erf-GELU, ReLU, and the GELU of a GELU


def test_a_product_read_elsewhere_or_an_epilogue_reading_another_tensor_does_not_qualify() -> None:
    x, w, b = _inputs()
    r = rand((4096, 3072), seed=4)

    def both(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.linear(x, w, b)
        return torch.relu(h), h

    def residual(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.relu(F.linear(x, w, b) + r)

    for fn, inputs in ((both, [x, w, b]), (residual, [x, w, b, r])):
        program, _ = lower_graph(trace(fn, *inputs), inputs)
        assert all(activation_of(g) is None for g in program.kernels)


@pytest.mark.parametrize("name", ["gelu_new", "relu"])
def test_the_call_matches_eager_and_round_trips_through_the_schedule(name: str) -> None:
    act, want = EPILOGUES[name]
    inputs = _inputs(37, 24, 20)  # small: the GPU's heuristic would pick the template
    gm = trace(_mlp(act), *inputs)
    schedule = compiler.heuristic_schedule(gm, H200, inputs)
    (kernel,) = schedule.kernels
    schedule = schedule.with_kernel(kernel.name, variant="aten_act")
    again = Schedule.from_json(schedule.to_json())
    built = compiler.build(gm, again, inputs)
    built.poison = True
    assert_matches(built(*inputs), _mlp(act)(*inputs), MM_TOL)
    assert built.fallback_ops == ["aten.addmm.default"]
    (built_kernel,) = built.kernels
    assert not built_kernel.triton and want in built_kernel.source
    (call,) = built.kernel_calls(*inputs)
    call.launch()


def test_a_schedule_that_gives_aten_act_to_another_epilogue_is_refused() -> None:
    inputs = _inputs(37, 24, 20)
    gm = trace(_mlp(F.silu), *inputs)
    schedule = compiler.heuristic_schedule(gm, H200, inputs)
    (kernel,) = schedule.kernels
    with pytest.raises(ValueError, match="cannot be generated"):
        compiler.build(gm, schedule.with_kernel(kernel.name, variant="aten_act"), inputs)


def test_the_tuners_space_holds_the_call_the_library_and_the_template() -> None:
    inputs = _inputs()
    gm = trace(_mlp(_gelu_new), *inputs)
    kernel = compiler.heuristic_schedule(gm, H200, inputs).to_json()["kernels"][0]
    assert kernel["variant"] == "aten_act"
    variants = {variant for variant, _ in raw_space(kernel)}
    assert variants == {"aten_act", "aten", "triton"}
    other = {**kernel, "variant": "aten"}
    assert "aten_act" not in {variant for variant, _ in raw_space(other)}


def test_the_calls_cpu_path_computes_the_tanh_gelu() -> None:
    x, w, b = rand((5, 6), seed=5), rand((6, 7), seed=6), rand((7,), seed=7)
    got = AddmmActivation("gelu_tanh")(b, x, w)
    assert_matches(got, F.gelu(torch.addmm(b, x, w), approximate="tanh"), MM_TOL)
    with pytest.raises(ValueError, match="unknown activation"):
        AddmmActivation("swish")


def test_a_product_viewed_back_to_three_dims_qualifies_and_keeps_the_graphs_shape() -> None:
    """Hugging Face GPT-2's Conv1D: addmm of the flattened tokens, viewed back to
    (batch, seq, features), then its GELU."""
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _gelu_new(torch.addmm(b, x.view(-1, x.shape[-1]), w).view(x.shape[0], x.shape[1], -1))

    inputs = [rand((2, 9, 24), seed=8), rand((24, 20), seed=9), rand((20,), seed=10)]
    gm = trace(fn, *inputs)
    program, _ = lower_graph(gm, inputs)
    (group,) = program.kernels
    assert activation_of(group)[0] == "gelu_tanh"
    schedule = compiler.heuristic_schedule(gm, H200, inputs)
    built = compiler.build(gm, schedule.with_kernel(group.name, variant="aten_act"), inputs)
    got = built(*inputs)
    assert got.shape == (2, 9, 20)
    assert_matches(got, fn(*inputs), MM_TOL)
