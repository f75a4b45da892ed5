"""`python -m bench.trace_probe`: dynamo's first trace after each backend's lookup, on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _probe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.trace_probe", "--device", "cpu", *args],
                          cwd=ROOT, env={**os.environ, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_each_lookup_is_traced_in_fresh_processes(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    done = _probe(tmp_path, "--model", "gpt_block_train", "--small", "--lookups", "none,kiln",
                  "--repeat", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(out.read_text())
    assert set(found["samples"]) == {"none", "kiln"}
    for lookup, runs in found["samples"].items():
        assert len(runs) == 2
        for run in runs:
            assert run["first_s"] > 0 and run["bytecode_tracing"] > 0
            # kiln's lookup does its warm-up here too (no GPU: the import alone skips it)
            assert (run["lookup_s"] > 0) == (lookup == "kiln")
    two = [r["bytecode_tracing"] for r in found["samples"]["kiln"]]
    assert found["medians"]["kiln"]["bytecode_tracing"] == sum(two) / 2  # median of two
    assert "bytecode_tracing" in done.stdout


def test_an_unknown_lookup_is_refused(tmp_path: Path) -> None:
    done = _probe(tmp_path, "--lookups", "none,tvm")
    assert done.returncode == 2 and "unknown lookups ['tvm']" in done.stderr
