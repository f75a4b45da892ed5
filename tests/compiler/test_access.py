"""Access patterns come from the op rules' declared reads, and each kernel records the memory
its fusion saves (`KernelGroup.fused_bytes`)."""

from __future__ import annotations

import torch

from compiler.codegen import access
from compiler.ir import base_name
from compiler.lowering.lower import lower_fx
from tests.compiler.oputil import rand, trace


def _patterns(fn, *inputs: torch.Tensor) -> dict[str, list[str]]:
    gm = lower_fx(trace(fn, *inputs), list(inputs)).gm
    return {base_name(n): [p for _, p in access.patterns(n)] for n in gm.graph.nodes
            if n.op == "call_function" and base_name(n) != "getitem"}


def test_each_input_has_the_pattern_its_rule_declares() -> None:
    x, b, w, i = rand((4, 6)), rand((6,), seed=1), rand((6, 5), seed=2), torch.tensor([[1], [0], [3], [2]])

    def fn(x, b, w, i):
        return (x + b).exp().t() * 2, torch.gather(x, 1, i), x.sum(-1), x @ w, torch.flip(x, [1])

    found = _patterns(fn, x, b, w, i)
    assert found["add"] == ["same", "broadcast"]
    assert found["exp"] == ["same"]
    assert found["permute"] == ["reindexed"]
    assert found["gather"] == ["same", "gathered"]
    assert found["sum"] == ["row-reduced"]
    assert found["mm"] == ["row-reduced", "row-reduced"]
    assert found["flip"] == ["reindexed"]


def _centered(x: torch.Tensor) -> torch.Tensor:
    return x - x.sum(-1, keepdim=True)


def test_a_kernel_records_the_bytes_its_fusion_saves() -> None:
    x = rand((4, 6))
    (group,) = lower_fx(trace(_centered, x), [x]).kernels
    assert [base_name(m) for m in group.members] == ["sum", "sub"]
    # the row sums (4 x fp32) are neither written nor read back
    assert group.fused_bytes == 2 * 4 * 4


def test_a_member_stored_anyway_saves_its_read_alone() -> None:
    x = rand((4, 6))

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = x.sum(-1, keepdim=True)
        return x - s, s  # the sums are an output: written, but not read back

    (group,) = lower_fx(trace(fn, x), [x]).kernels
    assert group.fused_bytes == 4 * 4
