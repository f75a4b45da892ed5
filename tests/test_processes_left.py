"""The run-wide check of tests/conftest.py: a test that leaves a process running fails the
run (and the process is ended); one that ends within the grace period does not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests import processes

ROOT = Path(__file__).resolve().parent.parent


def _pytest(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run pytest on one test file with the repository's conftest as a plugin."""
    test = tmp_path / "test_child.py"
    test.write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.conftest", "--rootdir", str(tmp_path), str(test)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if processes.ended(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_process_left_running_fails_the_run_and_is_ended(tmp_path):
    out = _pytest(tmp_path, f"""
import subprocess
def test_leaves_a_sleeper():
    proc = subprocess.Popen(["sleep", "300"])
    open({str(tmp_path / 'pid')!r}, "w").write(str(proc.pid))
""")
    pid = int((tmp_path / "pid").read_text())
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 passed" in out.stdout
    assert f"pid {pid}: sleep 300" in out.stdout
    assert _gone(pid)


def test_a_process_ending_within_the_grace_period_is_not_counted(tmp_path):
    out = _pytest(tmp_path, """
import subprocess
def test_leaves_a_short_sleeper():
    subprocess.Popen(["sleep", "0.5"])
""")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "still running" not in out.stdout
