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


def _stderr(level: str | None, code: str = LINES) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = str(ROOT)
    if level is not None:
        env["KILN_LOG_LEVEL"] = level
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
