"""The Triton matmul template's configs per GPU class: the sm_90 row (compiler/README.md
gives the H200 timings it follows), the shared-memory fit every GPU config passes, the
tuner's space holding every config the heuristic picks, the Hopper configs compiled for
sm_90 without a GPU, and run on the interpreter."""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.codegen import kinds
from compiler.codegen.kinds import matmul as matmul_kind
from compiler.codegen.kinds.base import cdiv
from compiler.codegen.limits import SHARED_BY_CC, gpu_limits
from compiler.ir import Domain, KernelGroup
from tests.compiler.oputil import assert_matches, rand, trace
from tuner.records import Candidate
from tuner.space import candidates, prune_reason, raw_space


def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int) -> dict[str, int]:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": warps,
            "num_stages": stages}


# What the issue asks the sm_90 row and the tuner's space to hold (Hopper configs).
HOPPER = (_cfg(128, 128, 64, 8, 3), _cfg(128, 128, 64, 8, 4), _cfg(128, 128, 64, 8, 5),
          _cfg(128, 256, 64, 8, 3), _cfg(128, 256, 64, 8, 4), _cfg(64, 256, 64, 8, 4))


def _group(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16,
           batch: int = 1) -> KernelGroup:
    shape = (batch, m, n) if batch > 1 else (m, n)
    return KernelGroup("mm_0", "matmul", Domain(shape, (), k), [], 0, dtype=dtype)


def _config(arch: str, m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16,
            batch: int = 1) -> dict[str, int]:
    variant, config = kinds.kind_of("matmul", "triton").heuristic(
        _group(m, n, k, dtype, batch), True, arch)
    assert variant == "triton"
    return config


def test_the_sm90_row_keeps_a_full_waves_tiles_and_shrinks_those_short_of_one() -> None:
    # At least one wave of 128x128 tiles (132 SMs): the other classes' tiles.
    assert _config("sm_90", 4096, 4096, 4096) == _cfg(128, 256, 64, 8, 3)
    assert _config("sm_90a", 4096, 4096, 4096) == _cfg(128, 256, 64, 8, 3)
    assert _config("sm_90", 16384, 384, 384) == _cfg(128, 128, 64, 4, 3)
    assert _config("sm_90", 4096, 4096, 4096, torch.float32) == _cfg(128, 64, 32, 4, 2)
    # 48 tiles: M halves (96 tiles), then N (192), over 4 warps and 4 stages.
    assert _config("sm_90", 1024, 768, 768) == _cfg(64, 64, 64, 4, 4)
    assert _config("sm_90", 4096, 384, 1536) == _cfg(64, 128, 64, 4, 4)
    # K of at most three 64-wide steps fills no fourth stage.
    assert _config("sm_90", 1024, 768, 192) == _cfg(64, 64, 64, 4, 3)
    assert _config("sm_90", 1024, 768, 256)["num_stages"] == 4


@pytest.mark.parametrize("m, n, k, batch", [(1024, 768, 768, 1), (256, 1024, 4096, 1),
                                            (128, 128, 128, 1), (64, 3072, 768, 4),
                                            (4096, 384, 1536, 1)])
def test_on_sm90_a_product_short_of_one_wave_takes_smaller_tiles(m: int, n: int, k: int,
                                                                 batch: int) -> None:
    """Fewer 128x128 tiles than the H200's 132 SMs: tiles halve (M first, to 64) until they
    cover the SMs or reach 64x64, over 4 warps."""
    assert batch * cdiv(m, 128) * cdiv(n, 128) < matmul_kind.HOPPER_SMS
    cfg = _config("sm_90", m, n, k, batch=batch)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    assert bm * bn < 128 * 128 and min(bm, bn) >= min(64, m, n) and bm <= bn
    assert batch * cdiv(m, bm) * cdiv(n, bn) >= matmul_kind.HOPPER_SMS or max(bm, bn) == 64
    assert cfg["num_warps"] == 4 and cfg["BLOCK_K"] == 64 and cfg["GROUP_M"] == 8


def test_older_gpu_classes_keep_their_row() -> None:
    """sm_80's choices are those it had before the sm_90 row (they fit its 163 KiB)."""
    assert _config("sm_80", 4096, 4096, 4096) == _cfg(128, 256, 64, 8, 3)
    assert _config("sm_80", 1024, 768, 768) == _cfg(128, 128, 64, 4, 3)
    assert _config("sm_80", 256, 384, 384) == _cfg(128, 128, 64, 4, 3)
    assert _config("sm_80", 4096, 4096, 4096, torch.float32) == _cfg(128, 64, 32, 4, 2)
    assert _config("sm_86", 1024, 768, 768) == _cfg(128, 128, 64, 4, 3)
    assert _config("", 4096, 4096, 4096) == _cfg(128, 256, 64, 8, 3)  # no class: an A100's


def test_a_config_that_overflowed_an_older_gpu_now_fits_it() -> None:
    """sm_86/sm_89 (99 KiB a block) were given 128x256x64 over 3 stages for large half
    products: 147456 B, which fails at compile. It now loses a stage first."""
    old = _cfg(128, 256, 64, 8, 3)
    assert matmul_kind.shared_memory(old, 2) > SHARED_BY_CC[(8, 6)]
    for arch in ("sm_86", "sm_89"):
        cfg = _config(arch, 4096, 4096, 4096)
        assert cfg == _cfg(128, 256, 64, 8, 2)
        assert matmul_kind.shared_memory(cfg, 2) <= gpu_limits(arch).shared_memory


def test_fit_drops_stages_then_the_k_step_then_the_tile() -> None:
    big = _cfg(128, 256, 128, 8, 5)
    fit = matmul_kind.fit
    assert fit(big, 2, 10**9) == big
    assert fit(big, 2, 3 * (128 + 256) * 128 * 2) == {**big, "num_stages": 3}
    assert fit(big, 2, 2 * (128 + 256) * 64 * 2) == {**big, "num_stages": 2, "BLOCK_K": 64}
    assert fit(big, 2, 2 * (128 + 64) * 32 * 2) == _cfg(128, 64, 32, 8, 2)
    # Down to a 16x16 tile: two warps keep it busy (four accumulator elements a thread).
    assert fit(big, 4, 16 * 16 * 2 * 4) == _cfg(16, 16, 16, 2, 1)
    with pytest.raises(ValueError, match="no matmul tile fits"):
        fit(big, 4, 1000)


ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120", "")
SHAPES = ((16, 16, 16, 1), (24, 40, 8, 1), (256, 384, 384, 1), (1024, 768, 768, 1),
          (1024, 3072, 768, 1), (4096, 4096, 4096, 1), (6304, 384, 1536, 1),
          (8192, 50304, 768, 1), (768, 768, 16384, 1), (197, 64, 197, 96), (64, 3072, 768, 4))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_tuners_space_holds_every_config_the_heuristic_picks(arch: str) -> None:
    """The heuristic's choice, and the template config it keeps beside an ATen call, are
    points of the kinds' spaces that pruning keeps (not only kept as the heuristic's)."""
    target = type("T", (), {"device_type": "cuda", "arch": arch})()
    limits = gpu_limits(arch)
    for (m, n, k, batch), dtype in ((s, d) for s in SHAPES for d in (torch.bfloat16,
                                                                     torch.float32)):
        group = _group(m, n, k, dtype, batch)
        variant, config = kinds.heuristic(group, True, arch)
        kernel = {"name": "mm_0", "kind": "matmul", "variant": variant, "sizes": group.sizes,
                  "dtype": str(dtype).removeprefix("torch."), "config": config}
        shown = f"{arch} {m}x{n}x{k} (batch {batch}) {dtype}: {variant} {config}"
        space = {Candidate.of_kernel({**kernel, "variant": v, "config": c})
                 for v, c in raw_space(kernel)
                 if prune_reason("matmul", v, c, group.sizes, kernel["dtype"], limits) is None}
        assert Candidate.of_kernel(kernel) in space, shown
        assert Candidate.make("mm_0", "triton", config) in space, shown
        kept, _ = candidates(kernel, target)
        assert space == set(kept), shown


def test_the_sm90_space_holds_the_hopper_configs_that_fit() -> None:
    sm90 = type("T", (), {"device_type": "cuda", "arch": "sm_90"})()
    sm86 = type("T", (), {"device_type": "cuda", "arch": "sm_86"})()
    kernel = {"name": "mm_0", "kind": "matmul", "variant": "triton",
              "sizes": {"M": 4096, "N": 4096, "K": 4096, "batch": 1}, "dtype": "bfloat16",
              "config": _cfg(128, 128, 64, 8, 4)}
    kept, dropped = candidates(kernel, sm90)
    for cfg in HOPPER:
        assert Candidate.make("mm_0", "triton", cfg) in kept, cfg
    # 128x256x64 over 5 stages needs 240 KiB: more than an H200 block's 227.
    too_deep = Candidate.make("mm_0", "triton", _cfg(128, 256, 64, 8, 5))
    assert too_deep not in kept
    assert "shared memory" in dict(dropped)[too_deep]
    kept_86, _ = candidates(kernel, sm86)
    assert Candidate.make("mm_0", "triton", _cfg(128, 256, 64, 8, 3)) not in kept_86
    assert Candidate.make("mm_0", "triton", _cfg(128, 256, 64, 8, 2)) in kept_86


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


def _linear_gelu_inputs(m: int, n: int, k: int) -> list[torch.Tensor]:
    return [rand((m, k), torch.bfloat16, low=-1, high=1, seed=1),
            rand((n, k), torch.bfloat16, low=-0.1, high=0.1, seed=2),
            rand((n,), torch.bfloat16, seed=3)]


def _with_config(gm, inputs, config: dict[str, int]) -> compiler.Schedule:
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    schedule = compiler.heuristic_schedule(gm, target, inputs)
    mm = next(k for k in schedule.kernels if k.kind == "matmul")
    return schedule.with_kernel(mm.name, variant="triton", config=config, source_hash=None)


def _compile_for_sm90(configs: list[dict[str, int]]) -> list[tuple[int, int, bool]]:
    """In a spawned process (Triton imported with the interpreter off): each config of the
    template, with a bias and GELU epilogue, compiled for sm_90 as the service compiles for
    a target (`compiler.aot.compile_for_target`: the launch as the JIT specialises it on
    aligned buffers); per config, the compiled kernel's shared memory and warps, and
    whether the JIT's specialisation was found (without its alignment Triton neither
    copies asynchronously nor pipelines)."""
    import os

    os.environ["TRITON_INTERPRET"] = "0"  # before Triton loads
    from compiler import aot

    inputs = _linear_gelu_inputs(1024, 1024, 1024)
    gm = trace(_linear_gelu, *inputs)
    out = []
    for config in configs:
        built = compiler.build(gm, _with_config(gm, inputs, config), inputs)
        spec = next(s for s in aot.launch_specs(built) if "BLOCK_M" in s.constexprs)
        compiled, key = aot.compile_for_target(spec, 90)
        out.append((compiled.metadata.shared, compiled.metadata.num_warps, key is not None))
    return out


@pytest.mark.slow
def test_the_hopper_configs_compile_for_sm90_and_fit_its_shared_memory() -> None:
    configs = [*HOPPER, _config("sm_90", 1024, 768, 768)]
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        compiled = pool.submit(_compile_for_sm90, configs).result(timeout=900)
    limit = gpu_limits("sm_90").shared_memory
    for config, (shared, warps, specialised) in zip(configs, compiled, strict=True):
        assert specialised, config
        assert 0 < shared <= limit, (config, shared)
        # The fit check counts what Triton allocates on sm_90: one A and one B tile a
        # stage; the epilogue reuses them.
        assert shared == matmul_kind.shared_memory(config, 2), (config, shared)
        assert warps == config["num_warps"]


@pytest.mark.parametrize("m, n, k, config", [(128, 128, 128, HOPPER[1]),
                                             (128, 256, 128, HOPPER[4]),
                                             (64, 256, 192, HOPPER[5])])
def test_the_hopper_configs_compute_the_product_on_the_interpreter(
        m: int, n: int, k: int, config: dict[str, int]) -> None:
    """One tile of each config (a 128x128 tile covers a 128x128 product), with a bias and
    GELU epilogue, several K steps."""
    inputs = _linear_gelu_inputs(m, n, k)
    gm = trace(_linear_gelu, *inputs)
    built = compiler.build(gm, _with_config(gm, inputs, config), inputs)
    assert [k.variant for k in built.schedule.kernels if k.kind == "matmul"] == ["triton"]
    assert_matches(built(*inputs), _linear_gelu(*inputs))
