"""KILN_LOG_LEVEL and the client's log lines, as a plain user's process shows them (no
logging setup of its own) and as an application's logging receives them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One line per level on `kiln`, and a progress line (`kiln.progress`, INFO).
LINES = """
import logging, kiln
log = logging.getLogger("kiln")
log.debug("kiln: a debug line")
log.info("kiln: an info line")
log.warning("kiln: a warning line")
logging.getLogger("kiln.progress").info("kiln: a progress line")
"""


def _stderr(level: str | None, code: str = LINES, torch_logs: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.pop("TORCH_LOGS", None)
    env["PYTHONPATH"] = str(ROOT)
    if level is not None:
        env["KILN_LOG_LEVEL"] = level
    if torch_logs is not None:
        env["TORCH_LOGS"] = torch_logs
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stderr


def _shown(stderr: str) -> list[str]:
    return [line.removeprefix("kiln: ") for line in stderr.splitlines()]


@pytest.mark.parametrize(("level", "shown"), [
    (None, ["a warning line", "a progress line"]),  # the default: warnings, and progress
    ("info", ["an info line", "a warning line", "a progress line"]),
    ("INFO", ["an info line", "a warning line", "a progress line"]),
    ("debug", ["a debug line", "an info line", "a warning line", "a progress line"]),
    ("warning", ["a warning line"]),
    ("error", []),
])
def test_kiln_log_level_sets_what_a_plain_user_sees(level, shown):
    assert _shown(_stderr(level)) == shown


def test_a_bad_kiln_log_level_is_one_line_and_the_default_stays():
    lines = _shown(_stderr("loud"))
    assert lines[0] == ("KILN_LOG_LEVEL='loud' is not a level (debug, info, warning, error "
                        "or critical); keeping the default (warnings, and progress lines)")
    assert lines[1:] == ["a warning line", "a progress line"]


def test_an_application_that_configured_logging_gets_each_line_once_through_its_handlers():
    code = "import logging; logging.basicConfig(format='app %(name)s %(message)s')\n" + LINES
    assert _stderr("info", code).splitlines() == [
        "app kiln kiln: an info line", "app kiln kiln: a warning line",
        "app kiln.progress kiln: a progress line"]


@pytest.mark.parametrize(("torch_logs", "level", "first", "shown"), [
    ("+kiln", None, "torch", ["a debug line", "an info line", "a warning line",
                              "a progress line"]),
    ("+kiln", None, "kiln", ["a debug line", "an info line", "a warning line",
                             "a progress line"]),
    ("kiln", "warning", "torch", ["an info line", "a warning line", "a progress line"]),
    ("-kiln", None, "kiln", []),
])
def test_torch_logs_sets_the_kiln_loggers_as_it_sets_torchs_own(torch_logs, level, first, shown):
    """torch's `TORCH_LOGS` takes any module's name: `+kiln` is debug, `kiln` info (over
    KILN_LOG_LEVEL), `-kiln` errors only, whichever of torch and kiln is imported first;
    each line once, through torch's handler (its `V1204 13:18:27.42 123 file:5] ` prefix)."""
    imports = "import torch\n" + LINES if first == "torch" else LINES.replace(
        "import logging, kiln", "import logging, kiln, torch")
    lines = _stderr(level, imports, torch_logs).splitlines()
    assert [line.split("] ", 1)[1].removeprefix("kiln: ") for line in lines] == shown
