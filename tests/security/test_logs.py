"""Log lines: client text that reaches a log record (a worker logs a failing job's exception,
which an op such as aten._assert_async.msg fills with a client string) must not forge records
or carry terminal escapes in the plain-text format."""

from __future__ import annotations

import json
import logging

import pytest

from service import logs

FORGED = "boom\n2026-11-30 12:00:00,000 CRITICAL service.auth: admin token leaked\r\x1b[2J\u2028x"


def _record(*args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError(FORGED)
        except RuntimeError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("service.worker", logging.WARNING, __file__, 1,
                             "job %s failed on %s: %s", args, exc_info)


@pytest.mark.parametrize("exc", [False, True])
def test_text_format_cannot_forge_a_record(exc: bool) -> None:
    formatter = logs.TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    text = formatter.format(_record(7, "w1", f"RuntimeError: {FORGED}", exc=exc))
    lines = text.split("\n")
    assert lines[0].split(" ", 3)[2] == "WARNING"
    assert len(lines) > 1 and all(line.startswith("    ") for line in lines[1:])
    for bad in ("\r", "\x1b", "\u2028"):
        assert bad not in text
    assert "\\x1b[2J" in text and "\\r" in text  # escaped, still readable


def test_service_log_setup_uses_the_safe_formats() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("info", "text")
        assert isinstance(root.handlers[0].formatter, logs.TextFormatter)
        logs.configure("info", "json")
        entry = json.loads(root.handlers[0].formatter.format(_record(7, "w1", FORGED)))
        assert entry["message"].endswith(FORGED)  # JSON escapes it: one line per record
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
