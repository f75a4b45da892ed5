"""`python -m bench.lookup_load`: lookups at a set rate while the service builds, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import end_left_behind, new_mark

# slow: a load test against service processes.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_answers_every_lookup_and_writes_its_figures(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["HOME"] = str(tmp_path)
    mark = new_mark()
    env.update(mark)
    out = tmp_path / "lookup_load.json"
    args = ["--rate", "40", "--connections", "2", "--seconds", "1", "--repeat", "2",
            "--keys", "2", "--chain", "4", "--builders", "1", "--token", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "bench.lookup_load", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    left = end_left_behind(mark)  # the service and its children end with the script
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not left, left
    result = json.loads(out.read_text())
    assert result["command"] == "python -m bench.lookup_load " + " ".join(args)
    assert result["mode"] == "embedded" and result["auth"] == "client token"
    assert len(result["runs"]) == 2
    for run in result["runs"]:
        # Every lookup due was sent once: answered (all with their schedule) or dropped.
        assert run["answered"] + run["dropped_connections"] == 40
        assert run["statuses"] == {"200": run["answered"]} and run["answered"] > 0
        assert run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    spread = result["spread"]["req_per_s"]
    assert spread["min"] <= spread["median"] <= spread["max"]
