"""Fusion decides joins from metadata, without generating kernels (each kernel kind's
`can_fuse`, over the op rules' declared reads): on every join attempt of the corpus and the
kernel suite's cases, each kind's answer is the one generating the grown kernel in that kind's
variants gives (a NotFusible or not)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import fx

import compiler
from compiler.codegen import NotFusible, generate_kernel, kinds, writer
from compiler.codegen.access import Reads
from compiler.ir import KernelGroup
from compiler.lowering import fusion
from compiler.lowering.lower import lower_fx
from tests.compiler.fusion_plans import graphs
from tests.compiler.oputil import assert_matches, rand, trace


def _generates(kind: kinds.KernelKind, group: KernelGroup, is_buffer: Callable[[fx.Node], bool]) -> bool:
    answers = set()
    for variant in kind.variants:
        try:
            generate_kernel(group, variant, is_buffer, [])
        except NotFusible:
            answers.add(False)
        else:
            answers.add(True)
    assert len(answers) == 1, (group.name, kind.name, "variants disagree")
    return answers.pop()


def test_can_fuse_agrees_with_generating_the_grown_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: Counter[str] = Counter()
    for kind in {type(k) for k in kinds.KINDS}:
        original = kind.can_fuse

        def can_fuse(self: kinds.KernelKind, group: KernelGroup, node: fx.Node, reads: Reads,
                     _original: Callable = original) -> bool:
            got = _original(self, group, node, reads)
            if self.serves(group):  # a kind made for one pattern generates only that
                assert got == _generates(self, group, reads.is_buffer), (self.name, group.name, node.name, got)
            asked[f"{self.name}, {'refused' if not got else 'taken'}"] += 1
            return got

        monkeypatch.setattr(kind, "can_fuse", can_fuse)
    x, a, b = rand((4, 6)), rand((8, 8), seed=1), rand((8, 8), seed=2)
    for _, gm, inputs in [*graphs(), ("reshaped", trace(_reshaped_member, x), [x]),
                          ("transposed", trace(_transposed_epilogue, a, b), [a, b])]:
        lower_fx(gm, list(inputs))
    assert asked["reduction, taken"] > 50 and asked["matmul, taken"] > 5, asked
    assert asked["reduction, refused"] > 0 and asked["matmul, refused"] > 0, asked
    assert asked["pointwise, taken"] > 0, asked


def _transposed_epilogue(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = (a @ b).relu()  # joins the matmul's kernel
    return y + y.t()  # reads the accumulator at another element: its own kernel


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


def test_planning_writes_no_code(monkeypatch: pytest.MonkeyPatch) -> None:
    x, a, b = rand((4, 6)), rand((8, 8), seed=1), rand((8, 8), seed=2)
    lowered = [lower_fx(trace(_reshaped_member, x), [x]), lower_fx(trace(_transposed_epilogue, a, b), [a, b])]

    def no_writer(*args: object, **kwargs: object) -> None:
        raise AssertionError("fusion planning made a Writer")

    monkeypatch.setattr(writer.Writer, "__init__", no_writer)
    for program in lowered:
        steps, _ = fusion.plan_steps(program.gm)
        planned = [[m.name for m in s.members] for s in steps if isinstance(s, KernelGroup)]
        assert planned == [[m.name for m in k.members] for k in program.kernels]
