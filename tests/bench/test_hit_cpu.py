"""`python -m bench.hit_cpu`: a service hit's CPU work for an sm_90 target, on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import hit_cpu

# slow: both training graphs measured phase by phase, compiled for sm_90.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_every_phase_of_both_training_graphs_is_measured_for_sm90(tmp_path: Path) -> None:
    out = tmp_path / "hit.json"
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.hit_cpu", "--model", "gpt", "--batch", "1", "--repeat", "1",
         "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(out.read_text())
    (run,) = found["runs"]
    assert set(run) == {"forward", "backward"}
    for graph in run.values():
        assert all(graph[p] > 0 for p in hit_cpu.PHASES)
        # every distinct launch was specialised by Triton's JIT for sm_90
        assert 0 < graph["distinct_kernels"] <= graph["launches"]
    assert "total" in done.stdout
