"""`python -m bench.register_audit`: every kernel of a training step compiled for sm_90 on
the CPU, with its registers and the warps an SM holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.register_audit import warps_per_sm

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("registers", "warps", "shared", "want"), [
    (167, 4, 0, 12),  # the LayerNorm column sums' 64x64 tiles at ViT's size, before
    (40, 4, 0, 48),  # the same kernel's 16x32 tiles
    (32, 8, 0, 64),  # registers leave room for every warp an SM has
    (24, 1, 0, 32),  # one-warp blocks: 32 blocks an SM at most
    (32, 4, 100 * 1024, 8),  # shared memory bounds it: two blocks
])
def test_warps_an_sm_holds(registers: int, warps: int, shared: int, want: int) -> None:
    assert warps_per_sm(registers, warps, shared) == want


@pytest.mark.slow  # every launch of both graphs compiled for sm_90
def test_the_gpt_blocks_training_kernels_are_audited_for_sm90(tmp_path: Path) -> None:
    out = tmp_path / "audit.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(HOME=str(tmp_path), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    done = subprocess.run(
        [sys.executable, "-m", "bench.register_audit", "--model", "gpt_block_train", "--small",
         "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(out.read_text())
    assert set(found["graphs"]) == {"forward", "backward"}
    for graph in found["graphs"].values():
        kernels = graph["kernels"]
        assert kernels and graph["summary"]["launches"] == len(kernels)
        assert all(0 < k["registers"] <= 255 and 0 < k["warps_per_sm"] <= 64 for k in kernels)
        assert graph["summary"]["spilling"] == 0


def test_it_refuses_the_interpreter(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench.register_audit", "--model", "gpt_block_train"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "TRITON_INTERPRET" in done.stderr
