"""The examples fail loudly when kiln did not run the model (a graph fell back to eager),
and each fallback warning prints once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# slow: the examples run whole models in fresh processes on the interpreter.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run_example(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("KILN_") and k != "TRITON_INTERPRET"}
    base.update(KILN_URL="off", KILN_CACHE_DIR=str(tmp_path / "cache"),
                KILN_KERNEL_DIR=str(tmp_path / "kernels"), **env)
    return subprocess.run([sys.executable, str(ROOT / "examples" / "seed_mlp.py"), "--batch", "4",
                           "--device", "cpu"], env=base, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


def test_example_exits_nonzero_when_graphs_ran_eagerly(tmp_path: Path) -> None:
    out = run_example(tmp_path)  # CPU without TRITON_INTERPRET: kiln runs the graph eagerly
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: 1 graph(s) ran eagerly" in out.stdout and "TRITON_INTERPRET=1" in out.stdout
    assert "\nOK" not in out.stdout
    assert out.stderr.count("kiln [cpu_eager]") == 1, out.stderr  # one warning, printed once
    # It points at the user's line, not at kiln's own source.
    lines = out.stderr.splitlines()
    warning = next(i for i, line in enumerate(lines) if "kiln [cpu_eager]" in line)
    assert lines[warning].startswith(str(ROOT / "examples" / "seed_mlp.py") + ":"), out.stderr
    assert lines[warning + 1].strip() == "got = compiled(x)", out.stderr


def test_example_passes_when_kiln_built_the_graph(tmp_path: Path) -> None:
    out = run_example(tmp_path, TRITON_INTERPRET="1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("OK") and "kiln [" not in out.stderr


def test_a_plan_stored_by_an_interpreter_run_falls_back_without_the_interpreter(
        tmp_path: Path) -> None:
    """The second run finds the first one's plan; without TRITON_INTERPRET its CPU graph
    must still run eagerly with the one warning (it crashed in Triton's interpreter)."""
    assert run_example(tmp_path, TRITON_INTERPRET="1").returncode == 0
    assert list((tmp_path / "cache" / "plans").glob("??/*.json"))  # the plan the next run finds
    out = run_example(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: 1 graph(s) ran eagerly" in out.stdout, out.stdout + out.stderr
    assert out.stderr.count("kiln [cpu_eager]") == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
