"""`python -m bench.lookup_vs_submit`: a hit's submission against its lookup, per graph."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import end_left_behind, new_mark

# slow: training graphs timed against service processes.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_both_training_graphs_are_timed_both_ways_once_their_jobs_are_done(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["HOME"] = str(tmp_path)
    mark = new_mark()
    env.update(mark)
    done = subprocess.run(
        [sys.executable, "-m", "bench.lookup_vs_submit", "--model", "gpt", "--batch", "1",
         "--repeat", "1", "--timeout", "300"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    # The service's children (its target-compile process, the resource tracker) end with it.
    left = end_left_behind(mark)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not left, left
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()
            if line.startswith(("forward ", "backward "))}
    assert set(rows) == {"forward", "backward"}
    for _, kb, submit, lookup, job in rows.values():
        assert float(kb) > 10 and float(submit) > 0 and float(lookup) > 0
        assert job == "done"  # the heuristic schedule is final: what a hit's lookup takes
