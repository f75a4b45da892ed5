"""The registry of kernel kinds (compiler/codegen/kinds/): what it serves, the launch grids
its kinds compute, and that a reduction variant is one entry in its kind's module."""

from __future__ import annotations

import pytest
import torch

import compiler
from compiler.codegen import kinds
from compiler.codegen.kinds import reduction as reduction_kind
from compiler.codegen.reduction import RowFrame
from compiler.ir import Domain, KernelGroup
from compiler.scheduling.schedule import validate_config
from tests.compiler.oputil import assert_matches, rand, trace
from tuner.records import Candidate
from tuner.space import candidates


def test_every_group_kind_is_served_and_variants_name_one_kind() -> None:
    assert {k: kinds.variants_of(k) for k in ("pointwise", "reduction", "matmul")} == {
        "pointwise": ("pointwise",),
        "reduction": ("looped", "persistent", "online"),
        "matmul": ("aten_act", "aten", "triton"),
    }
    for kind in kinds.KINDS:
        for variant in kind.variants:
            assert kinds.kind_of(kind.group_kind, variant) is kind
            assert kinds.kind_of_variant(variant) is kind
    assert kinds.variant_order() == ("pointwise", "persistent", "online", "looped", "aten_act",
                                     "aten", "triton")
    with pytest.raises(ValueError, match="not one of"):
        kinds.kind_of("reduction", "triton")
    assert kinds.kind_of_variant("nope") is None


def _matmul_group(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> KernelGroup:
    return KernelGroup("mm_0", "matmul", Domain((m, n), (), k), [], 0, dtype=dtype)


def test_the_aten_call_claims_only_big_matmuls_on_a_gpu() -> None:
    big, small = _matmul_group(8192, 4096, 4096), _matmul_group(256, 256, 256)
    variant, config = kinds.heuristic(big, gpu=True)
    assert variant == "aten"
    assert (variant, config) == ("aten", kinds.kind_of("matmul", "triton").heuristic(big, True)[1])
    assert kinds.heuristic(big, gpu=False)[0] == "triton"
    assert kinds.heuristic(small, gpu=True)[0] == "triton"


def test_the_matmul_choice_follows_the_gpu_classs_measurements() -> None:
    """The nearest measured shape of the target's GPU class decides (with the same epilogue
    flag); far from every measurement, or on a class without a table, the FLOP rule."""
    from compiler.codegen.kinds import matmul_choice
    from compiler.codegen.kinds.matmul_table import MEASURED

    lost = [r for r in MEASURED["sm_90"] if not r[4]]
    assert lost, "the table should hold a shape where the template won"
    m, n, k, epilogue, _ = lost[0]
    assert not matmul_choice.library_wins("sm_90", 1, m, n, k, epilogue)
    assert matmul_choice.library_wins("sm_90", 1, m, n, k, not epilogue)  # the other flag's row
    # A ViT-B/16 MLP product with its GELU (6304 tokens): near measured rows the library won.
    assert matmul_choice.library_wins("sm_90", 1, 6304, 3072, 768, True)
    # Batched products count their batch into M.
    assert matmul_choice.library_wins("sm_90", 96, 64, 3072, 768, True)
    tiny = (1, 32, 256, 128)
    assert not matmul_choice.library_wins("sm_90", *tiny, False)  # far from every row: the rule
    assert not matmul_choice.library_wins("sm_75", *tiny, False)
    assert matmul_choice.library_wins("sm_75", 1, 4096, 4096, 4096, True)


def _mlp(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h = torch.relu(x @ w) * 2.0
    return h, torch.softmax(h, dim=-1), x.exp() + 1


def test_each_kinds_grid_is_the_launch_grid_the_build_uses() -> None:
    x, w = rand((48, 40)), rand((40, 72), seed=1)
    gm = trace(_mlp, x, w)
    base = compiler.build(gm, None, [x, w]).schedule
    mm = next(k for k in base.kernels if k.kind == "matmul")
    seen = set()
    for schedule in (base, base.with_kernel(mm.name, variant="aten", source_hash=None)):
        built = compiler.build(gm, schedule, [x, w])
        groups = {g.name: g for g in built.program.kernels}
        choices = {c.name: c for c in built.schedule.kernels}
        for launch in built.launches():
            group, choice = groups[launch.kernel], choices[launch.kernel]
            kind = kinds.kind_of(choice.kind, choice.variant)
            config = kind.launch_config(group, choice.config, False)
            assert kind.grid(group, choice.variant, config) == launch.grid, kind.name
            assert launch.constexprs.items() <= config.items()
            seen.add(kind.name)
        assert_matches(built(x, w), _mlp(x, w))
    assert seen == {"pointwise", "reduction", "matmul", "aten"}


def _toy(frame: RowFrame) -> None:
    """A toy reduction variant: the looped one under another name (and a comment)."""
    frame.w.emit("# toy variant")
    reduction_kind.looped(frame)


def test_a_reduction_variant_is_one_entry_in_its_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    x = rand((6, 50))
    gm = trace(lambda t: torch.softmax(t, dim=-1), x)
    base = compiler.build(gm, None, [x]).schedule
    red = next(k for k in base.kernels if k.kind == "reduction")
    toy = base.with_kernel(red.name, variant="toy", config=dict(red.config, RBLOCK=16),
                           source_hash=None)
    with pytest.raises(ValueError, match="variant 'toy' is not one of"):
        compiler.build(gm, toy, [x])

    monkeypatch.setitem(reduction_kind.VARIANTS, "toy", reduction_kind.Variant(_toy, opt_in=True))
    assert kinds.variants_of("reduction") == ("looped", "persistent", "online", "toy")
    built = compiler.build(gm, toy, [x])
    kernel = next(k for k in built.kernels if k.name == red.name)
    assert kernel.variant == "toy" and "# toy variant" in kernel.source
    assert_matches(built(x), torch.softmax(x, dim=-1))
    # the schedule format, the tuning space and the tie order take it from the same entry
    assert compiler.Schedule.from_json(built.schedule.to_json()) == built.schedule
    entry = next(k for k in built.schedule.to_json()["kernels"] if k["name"] == red.name)
    space, _ = candidates(entry, compiler.Target.named("sm_90", name="NVIDIA H200"))
    assert {c.variant for c in space} == {"looped", "persistent", "toy"}
    assert kinds.variant_order()[-4:] == ("toy", "aten_act", "aten", "triton")
    assert Candidate.make(red.name, "toy", {}).order_key() < Candidate.make(red.name, "aten", {}).order_key()
    with pytest.raises(ValueError, match="RBLOCK must be a power of two"):
        validate_config("reduction", "toy", dict(red.config, RBLOCK=24), red.sizes, red.name)
