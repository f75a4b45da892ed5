"""`kiln.report()`: what a run compiled, from where, and the time it took, in a few lines;
`KILN_REPORT=1` prints it at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln
from kiln import degrade, session
from tests.kiln.fake_http import FakeServer
from tests.kiln.helpers import causes, free_port, train_mlp
from tests.kiln.test_backend_local import TunedLater

pytestmark = pytest.mark.usefixtures("kiln_state")
ROOT = Path(__file__).resolve().parents[2]


def _lines(text: str) -> dict[str, str]:
    """The report's lines by their first word (the heading line under `kiln`)."""
    return {line.split(":")[0].strip(): line for line in text.splitlines()}


def _kernels() -> int:
    return sum(len(g.built.kernels) for g in session.compiled_graphs())


def test_a_local_run_then_a_restart_from_the_cache():
    kiln.configure(url=None)
    train_mlp(steps=2)
    lines = _lines(kiln.report())
    assert lines["kiln"].startswith("kiln: 2 graphs compiled (0 left eager), ")
    assert lines["kiln"].endswith(" of your threads' time")
    assert lines["schedules"] == "  schedules: 2 computed here"
    assert lines["now"] == "  now: 2 heuristic"
    assert lines["kernels"] == f"  kernels: {_kernels()} generated"
    assert "fallbacks" not in lines and "plans" not in lines
    # (a plan lookup leads the line when plans are on; whether one ran depends on the
    # process's earlier tests, so it is not asserted here)
    assert lines["time"].startswith("  time: ") and "AOTAutograd " in lines["time"]
    assert "code generation " in lines["time"] and "service" not in lines["time"]

    torch._dynamo.reset()
    degrade.reset()
    train_mlp(steps=2)
    assert _lines(kiln.report())["schedules"] == "  schedules: 2 from the local cache"


def test_tuned_schedules_from_the_service_and_the_wait_for_them(kiln_warnings):
    with FakeServer(TunedLater(pending_polls=2)) as srv:
        kiln.configure(url=srv.url, mode="wait", poll_interval=0.05, plans=False)
        train_mlp(steps=1)
    lines = _lines(kiln.report())
    assert lines["schedules"] == "  schedules: 2 from the service"
    assert lines["now"] == "  now: 2 tuned"
    assert "service exchange " in lines["time"]
    assert not causes(kiln_warnings)


def test_fallbacks_are_counted_by_cause(kiln_warnings):
    kiln.configure(url=f"http://127.0.0.1:{free_port()}", retries=0, plans=False)
    train_mlp(steps=1)
    lines = _lines(kiln.report())
    assert lines["schedules"] == "  schedules: 2 computed here"
    assert lines["fallbacks"].startswith("  fallbacks: unreachable ")
    assert lines["fallbacks"].endswith(" (each cause was warned about once)")


def test_nothing_compiled_is_one_line():
    assert kiln.report() == "kiln: no graph compiled"


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    clean.update(PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", KILN_URL="off", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean, cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_kiln_report_prints_it_at_exit(tmp_path):
    code = ("import torch, kiln\n"
            "f = torch.compile(lambda x: torch.sin(x) * 2, backend='kiln')\n"
            "f(torch.randn(8))\n"
            "print('done')\n")
    out = _run(code, KILN_REPORT="1", KILN_CACHE_DIR=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"
    report = out.stderr[out.stderr.index("kiln: 1 graph compiled"):]
    assert "  schedules: 1 computed here" in report.splitlines()
    out = _run(code, KILN_CACHE_DIR=str(tmp_path))
    assert out.returncode == 0 and "graph compiled" not in out.stderr, out.stderr
