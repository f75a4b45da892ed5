"""Pruning rules: nothing that cannot fit the target survives to be compiled."""

from __future__ import annotations

from tests.tuner.fakes import matmul_kernel as mm
from tuner.records import Candidate
from tuner.space import candidates, limits_for, neighbours, prune_reason

H100 = type("T", (), {"device_type": "cuda", "arch": "sm_90"})()
A10 = type("T", (), {"device_type": "cuda", "arch": "sm_86"})()


def test_shared_memory_limit_depends_on_the_arch() -> None:
    cfg = {
        "BLOCK_M": 256,
        "BLOCK_N": 128,
        "BLOCK_K": 64,
        "GROUP_M": 8,
        "num_warps": 8,
        "num_stages": 4,
    }
    # (256*64 + 64*128) * 2 B * 4 stages = 196608 B: fits sm_90 (227 KiB), not sm_86 (99 KiB)
    assert prune_reason("matmul", "triton", cfg, {}, "bfloat16", limits_for(H100)) is None
    reason = prune_reason("matmul", "triton", cfg, {}, "bfloat16", limits_for(A10))
    assert reason and "shared memory" in reason
    h100a = type("T", (), {"device_type": "cuda", "arch": "sm_90a"})()
    assert limits_for(h100a) == limits_for(H100)  # the arch-specific suffix names the same cc


def test_every_kept_matmul_config_fits_and_every_dropped_one_says_why() -> None:
    kept, dropped = candidates(mm(), H100)
    limit = limits_for(H100).shared_memory
    for c in kept:
        if c.variant == "triton":
            cfg = c.config
            smem = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2 * cfg["num_stages"]
            assert smem <= limit
            assert cfg["BLOCK_M"] * cfg["BLOCK_N"] // (cfg["num_warps"] * 32) <= 128
    assert dropped and all(reason for _, reason in dropped)
    assert any(c.variant == "aten" for c in kept)


def test_threads_per_block_capped() -> None:
    reason = prune_reason(
        "pointwise", "pointwise", {"XBLOCK": 4096, "num_warps": 64}, {}, "float32", limits_for(H100)
    )
    assert reason and "threads" in reason


def test_persistent_reduction_must_cover_the_row() -> None:
    reason = prune_reason(
        "reduction",
        "persistent",
        {"XBLOCK": 1, "RBLOCK": 1024, "num_warps": 4},
        {"rnumel": 2048},
        "float32",
        limits_for(H100),
    )
    assert reason and "rnumel" in reason


def test_register_spill_rule_for_reductions() -> None:
    # 64 rows x 4096 columns over 4 warps is 2048 elements per thread: certain spills.
    cfg = {"XBLOCK": 64, "RBLOCK": 4096, "num_warps": 4}
    reason = prune_reason("reduction", "looped", cfg, {"rnumel": 8192}, "float32", limits_for(H100))
    assert reason is not None


def test_tiny_shapes_clip_blocks_and_keep_the_heuristic() -> None:
    kernel = mm(M=32, N=10, K=256, dtype="float32")
    kernel["config"] = {
        "BLOCK_M": 32,
        "BLOCK_N": 16,
        "BLOCK_K": 64,
        "GROUP_M": 8,
        "num_warps": 2,
        "num_stages": 2,
    }
    kept, _ = candidates(kernel, H100)
    assert all(
        c.config.get("BLOCK_N", 16) <= 16 and c.config.get("BLOCK_M", 32) <= 32 for c in kept
    )
    assert Candidate.make("mm_0", "triton", kernel["config"]) in kept


def test_space_order_is_fixed() -> None:
    a, _ = candidates(mm(), H100)
    b, _ = candidates(mm(), H100)
    assert a == b == sorted(a, key=Candidate.order_key)


def test_neighbours_step_one_parameter() -> None:
    kernel = {
        "name": "red_0",
        "kind": "reduction",
        "variant": "looped",
        "sizes": {"xnumel": 8192, "rnumel": 4096},
        "dtype": "float32",
        "config": {"XBLOCK": 1, "RBLOCK": 512, "num_warps": 4, "num_stages": 1},
    }
    space, _ = candidates(kernel, H100)
    start = Candidate.make("red_0", "looped", kernel["config"])
    steps = neighbours(start, space)
    assert steps
    same_variant = [s for s in steps if s.variant == "looped"]
    for s in same_variant:
        changed = [k for k in s.config if s.config[k] != start.config[k]]
        assert len(changed) == 1
    assert any(s.variant == "persistent" for s in steps)
