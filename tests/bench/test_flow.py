"""`python -m bench.flow` end to end on the CPU: the embedded serve builds every graph of a
training step, fresh wait-mode clients fetch the schedules, and the JSON record says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_flow_serves_every_graph_of_a_training_step(tmp_path: Path) -> None:
    out = tmp_path / "flow.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.flow", "--device", "cpu", "--small", "--redis", "off",
         "--models", "gpt_block_train", "--iters", "1", "--timeout", "300", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["service_mode"] == "embedded"
    assert [g["status"] for g in record["graphs"]] == ["heuristic", "heuristic"]  # fwd, bwd
    (case,) = record["cases"]
    stats = case["measure"]["stats"]
    assert stats["schedules_fetched"] == stats["graphs"] == 2 and stats["eager"] == 0
    assert case["measure"]["error_vs_eager"] < 0.02
    assert "per graph (the service's record)" in done.stdout
