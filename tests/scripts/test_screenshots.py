"""scripts/screenshots.py without the browser: the environment its processes get, what it
reads from the service's answers, and how it ends what it started. (The whole run, a real
`kiln serve`, the examples and chromium, takes a minute: `python scripts/screenshots.py`.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import marked, new_mark

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "screenshots.py"


@pytest.fixture(scope="module")
def shots():
    spec = importlib.util.spec_from_file_location("screenshots", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runs_processes_get_none_of_the_callers_kiln_settings(shots, monkeypatch, tmp_path):
    for name, value in (("KILN_REDIS_URL", "redis://elsewhere:6379/0"),
                        ("KILN_DATABASE_URL", "postgresql://prod/kiln"),
                        ("KILN_URL", "http://elsewhere:8000"), ("KILN_MODE", "async"),
                        ("TORCH_LOGS", "+dynamo")):
        monkeypatch.setenv(name, value)
    mark = new_mark()
    server = shots.run_env(tmp_path, mark)
    assert server["KILN_DATABASE_URL"] == f"sqlite:///{tmp_path / 'data' / 'kiln.db'}"
    assert {"KILN_REDIS_URL", "KILN_URL", "KILN_MODE", "TORCH_LOGS"}.isdisjoint(server)
    assert server["KILN_KERNEL_DIR"].startswith(str(tmp_path))
    assert server["TRITON_INTERPRET"] == "1" and mark.items() <= server.items()
    client = shots.run_env(tmp_path, mark, "http://127.0.0.1:8123", "cache-2")
    assert client["KILN_URL"] == "http://127.0.0.1:8123"
    assert client["KILN_CACHE_DIR"] == str(tmp_path / "cache-2")


def test_the_admin_token_is_the_one_kept_beside_the_database(shots, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "admin-token").write_text("kiln_abc\n")
    assert shots.admin_token(tmp_path) == "kiln_abc"
    (tmp_path / "data" / "admin-token").write_text("\n")
    with pytest.raises(RuntimeError, match="empty"):
        shots.admin_token(tmp_path)


def test_the_queue_is_idle_only_with_no_job_queued_or_running(shots):
    assert shots.idle({"jobs_waiting": {}})
    assert shots.idle({"jobs_waiting": {"build": {"queued": 0, "running": 0}}})
    assert not shots.idle({"jobs_waiting": {"build": {"queued": 0, "running": 1}}})
    assert not shots.idle({"jobs_waiting": {"tune": {"queued": 2, "running": 0}}})


def test_the_entry_is_found_by_its_tag_and_a_missing_tag_names_those_there(shots):
    entries = {"items": [{"key": "k1", "tag": "GPT forward"},
                         {"key": "k2", "tag": "SeedMLP inference"}]}
    assert shots.entry_key(entries, "SeedMLP inference") == "k2"
    with pytest.raises(RuntimeError, match="GPT forward, SeedMLP inference"):
        shots.entry_key(entries, "ResNet forward")


def test_stop_interrupts_the_server_then_kills_what_it_left_running(shots):
    mark = new_mark()
    orphan = "import time; time.sleep(60)"
    # A stand-in server: Ctrl-C's signal ends it, a child in a session of its own stays.
    server = subprocess.Popen(
        [sys.executable, "-c", "import signal, subprocess, sys, time; "
         "signal.signal(signal.SIGINT, lambda *_: sys.exit(0)); subprocess.Popen("
         f"[sys.executable, '-c', {orphan!r}], start_new_session=True); time.sleep(60)"],
        env={**os.environ, **mark})
    deadline = time.monotonic() + 30
    while len(marked(mark)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marked(mark)) == 2
    killed = shots.stop(server, mark)
    assert server.returncode == 0  # its SIGINT handler ended it
    assert len(killed) == 1 and orphan in killed[0]
    assert marked(mark) == {}
