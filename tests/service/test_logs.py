"""Structured logs: KILN_LOG_FORMAT=json records carry job fields; a finished job is one
line with its duration."""

from __future__ import annotations

import io
import json
import logging

from service.logs import JsonFormatter, TextFormatter, log_job_finished


def _capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"kiln-test-{id(stream)}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


def test_json_records_carry_job_fields() -> None:
    logger, stream = _capture(JsonFormatter())
    log_job_finished(logger, 42, "ab" * 32, "build", "done", 1.23456, "host-1-cpu", attempt=1)
    record = json.loads(stream.getvalue())
    assert record["job"] == 42 and record["key"] == "ab" * 32 and record["stage"] == "build"
    assert record["outcome"] == "done" and record["duration_s"] == 1.235
    assert record["worker"] == "host-1-cpu" and record["level"] == "INFO"
    assert record["message"].startswith("job 42 build done in 1.23 s")
    logger.info("no job here")
    plain = json.loads(stream.getvalue().splitlines()[1])
    assert "job" not in plain and plain["message"] == "no job here"


def test_text_line_says_duration_and_a_failure_is_a_warning() -> None:
    logger, stream = _capture(TextFormatter("%(levelname)s %(message)s"))
    log_job_finished(logger, 7, "cd" * 32, "tune", "failed", 61.0, "w")
    assert stream.getvalue().strip() == \
        "WARNING job 7 tune failed in 61.00 s (key cdcdcdcdcdcd, worker w)"
