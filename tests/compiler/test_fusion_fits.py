"""Fusion decides joins without generating kernels (`KernelKind.fits`, `_Planner.reads_anchor`):
on every join attempt of the corpus and the BENCH cases, its answer is the one generating
the whole trial kernel gives (a NotFusible or not)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import fx

import compiler
from compiler.codegen import NotFusible, generate_kernel, kinds
from compiler.ir import KernelGroup
from compiler.lowering import fusion
from compiler.lowering.lower import lower_fx
from tests.compiler.fusion_plans import graphs
from tests.compiler.oputil import assert_matches, rand, trace


def _generates(group: KernelGroup, is_buffer: Callable[[fx.Node], bool]) -> bool:
    try:
        generate_kernel(group, kinds.trial_variant(group.kind), is_buffer, [])
    except NotFusible:
        return False
    return True


def test_fits_agrees_with_generating_the_trial_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = {"fits": 0, "no anchor": 0}
    for kind in {type(k) for k in kinds.KINDS}:
        original = kind.fits

        def fits(self: kinds.KernelKind, group: KernelGroup, node: fx.Node,
                 is_buffer: Callable[[fx.Node], bool], _original: Callable = original) -> bool:
            got = _original(self, group, node, is_buffer)
            assert got == _generates(group, is_buffer), (group.name, node.name, got)
            asked["fits"] += 1
            return got

        monkeypatch.setattr(kind, "fits", fits)
    reads_anchor = fusion.Planner.reads_anchor

    def checked(self: fusion.Planner, group: KernelGroup, node: fx.Node) -> bool:
        got = reads_anchor(self, group, node)
        if not got:  # no check at all: the trial kernel must generate
            assert _generates(group, self.is_buffer), (group.name, node.name)
            asked["no anchor"] += 1
        return got

    monkeypatch.setattr(fusion.Planner, "reads_anchor", checked)
    x = rand((4, 6))
    for _, gm, inputs in [*graphs(), ("reshaped", trace(_reshaped_member, x), [x])]:
        lower_fx(gm, list(inputs))
    assert asked["fits"] > 50 and asked["no anchor"] > 0, asked


def _reshaped_member(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a = x.exp()
    c = x.view(6, 4) * 2  # joins a's pointwise kernel: same element count, another shape
    return a, c, a.sum(-1)  # the sum cannot make that kernel a reduction: c is not a row


def test_a_reduction_does_not_join_a_kernel_whose_members_are_not_rows() -> None:
    x = rand((4, 6))
    gm = trace(_reshaped_member, x)
    program = lower_fx(gm, [x])
    kinds_of = {g.kind: [m.name for m in g.members] for g in program.kernels}
    assert set(kinds_of) == {"pointwise", "reduction"}, kinds_of
    assert len(kinds_of["pointwise"]) == 2, kinds_of
    built = compiler.build(gm, None, [x])
    assert_matches(built(x), _reshaped_member(x))
