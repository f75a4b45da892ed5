"""Fusion decisions: kernel counts and kinds for the patterns the issue names."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import compiler
from tests.compiler.oputil import check, rand, trace


def _kinds(built: compiler.Built) -> list[str]:
    return [f"{k.kind}:{k.variant}" for k in built.kernels]


def test_pointwise_chain_is_one_kernel() -> None:
    built = check(lambda x, y: torch.tanh(x * 2 + y).sigmoid() - y.t().t(), rand((7, 9), seed=1),
                  rand((7, 9), seed=2))
    assert _kinds(built) == ["pointwise:pointwise"]


def test_two_outputs_of_one_shape_share_a_kernel() -> None:
    built = check(lambda x: (x.exp(), x.sin() + 1), rand((5, 6), seed=3))
    assert len(built.kernels) == 1


def test_layer_norm_gelu_residual_is_one_reduction_kernel() -> None:
    w, b = rand((48,), seed=4), rand((48,), seed=5)
    built = check(lambda x, r: F.gelu(F.layer_norm(x, (48,), w, b)) + r, rand((6, 48), seed=6),
                  rand((6, 48), seed=7))
    assert _kinds(built) == ["reduction:persistent"]


def test_wide_softmax_reads_its_input_in_an_online_pass() -> None:
    x = rand((2, 5000), seed=8)
    built = check(lambda x: torch.softmax(x, -1), x)
    assert _kinds(built) == ["reduction:looped"]
    assert built.kernels[0].source.count("tl.load(") == 3  # max pass, sum pass, output pass
    k = built.schedule.kernels[0]
    online = built.schedule.with_kernel(k.name, variant="online", source_hash=None)
    built = check(lambda x: torch.softmax(x, -1), x, schedule=online)
    assert built.kernels[0].source.count("tl.load(") == 2  # one online pass, one output pass


def test_matmul_epilogues_fuse() -> None:
    x, w, b, r = rand((16, 32), seed=9), rand((24, 32), seed=10), rand((24,), seed=11), rand((16, 24), seed=12)
    built = check(lambda x, w, b, r: F.gelu(F.linear(x, w, b), approximate="tanh") + r, x, w, b, r,
                  tol=(1e-4, 1e-4))
    assert _kinds(built) == ["matmul:triton"]


def test_matmul_epilogue_member_reading_another_member_fuses() -> None:
    """GPT-2's MLP in a training forward: the half, the tanh and one plus the tanh are kept
    for the backward (outputs), and their product reads those, not the matmul's result:
    one kernel all the same."""
    x, w, b = rand((16, 32), seed=9), rand((24, 32), seed=10), rand((24,), seed=11)

    def gelu_new(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.linear(x, w, b)
        half, t = 0.5 * h, torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0)))
        one_plus = 1.0 + t
        return half * one_plus, half, t, one_plus

    built = check(gelu_new, x, w, b, tol=(1e-4, 1e-4))
    assert _kinds(built) == ["matmul:triton"]


def test_reductions_over_other_domains_stay_apart() -> None:
    built = check(lambda x: (x.sum(0), x.sum(1)), rand((6, 10), seed=13))
    assert len(built.kernels) == 2


def test_dead_code_and_constants_vanish() -> None:
    const = torch.arange(6.0)

    def fn(x: torch.Tensor) -> torch.Tensor:
        _unused = torch.exp(x).sum()
        folded = (const * 2 + 1).reshape(2, 3)  # evaluated at build time
        return x * 1 + folded

    x = rand((2, 3), seed=14)
    gm = trace(fn, x)
    built = check(fn, x)
    assert len(built.kernels) == 1
    assert not any(op in built.kernels[0].ops for op in ("aten.exp.default", "aten.sum.default"))
    assert len([n for n in gm.graph.nodes if n.op == "call_function"]) > 3


def test_groups_come_from_the_graph_alone() -> None:
    x = rand((4, 300), seed=15)
    gm = trace(lambda x: torch.log_softmax(x, -1), x)
    one = compiler.heuristic_schedule(gm, None, [x]).to_json()
    gpu = compiler.heuristic_schedule(gm, {"device_type": "cuda", "arch": "sm_90"}, [x]).to_json()
    assert one == compiler.heuristic_schedule(gm, None, [x]).to_json()
    assert [k["nodes"] for k in one["kernels"]] == [k["nodes"] for k in gpu["kernels"]]


def _residual_stack(layers: int) -> tuple[compiler.Built, torch.Tensor]:
    ws = [rand((32, 32), seed=20 + i, low=-0.2, high=0.2) for i in range(layers)]

    def fn(x: torch.Tensor) -> torch.Tensor:
        for w in ws:  # x = x + f(x): the residual stream of an eval-mode transformer
            x = x + torch.relu(F.layer_norm(x, (32,)) @ w)
        return F.layer_norm(x, (32,))

    x = rand((8, 32), seed=19)
    return check(fn, x, tol=(1e-4, 1e-4)), x


def test_residual_stream_is_stored_once_not_recomputed_per_layer() -> None:
    three, _ = _residual_stack(3)
    eight, _ = _residual_stack(8)
    assert len(eight.kernels) > len(three.kernels)
    assert {k.source_hash for k in eight.kernels} == {k.source_hash for k in three.kernels}
    assert max(len(k.nodes) for k in eight.kernels) == max(len(k.nodes) for k in three.kernels)


def test_cheap_value_of_graph_inputs_is_recomputed_by_each_kernel() -> None:
    built = check(lambda x: ((x * 2 + 1).sum(0), (x * 2 + 1).sum(1)), rand((6, 10), seed=21))
    assert len(built.kernels) == 2  # each reduction computes x * 2 + 1; no kernel stores it
