"""Log set-up for service processes: plain text, or one JSON object a line (KILN_LOG_FORMAT=json)
for log collectors."""

from __future__ import annotations

import json
import logging
import os

# Fields a record may carry (`extra=`) that JSON logs give as keys of their own, so a log
# collector can filter by job or key without parsing messages.
FIELDS = ("job", "key", "stage", "worker", "outcome", "duration_s", "attempt")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the structured FIELDS the
    record carries, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"t": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "logger": record.name, "message": record.getMessage(), "pid": record.process}
        entry.update({f: getattr(record, f) for f in FIELDS if hasattr(record, f)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """Plain-text records that client text cannot forge: control characters other than the
    newline (CR, ESC, NUL, ...) and Unicode line separators are escaped, and every line after
    a record's first is indented, so a message holding a newline and a fake record (an op
    echoing a client string, a traceback) can never read as a record of its own."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        text = "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)
        return text.replace("\n", "\n    ")


def configure(level: str = "info", fmt: str | None = None) -> None:
    """Configure the root logger once for a service process."""
    fmt = fmt or os.environ.get("KILN_LOG_FORMAT", "text")
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # start-up chatter


def log_job_finished(logger: logging.Logger, job_id: int, key: str, stage: str, outcome: str,
                     seconds: float, worker: str, attempt: int | None = None) -> None:
    """The one line a worker writes when a job stage ends (`outcome` done|failed|retry),
    with its duration; the same values as structured fields for KILN_LOG_FORMAT=json."""
    fields = {"job": job_id, "key": key, "stage": stage, "outcome": outcome,
              "duration_s": round(seconds, 3), "worker": worker, "attempt": attempt}
    logger.log(logging.WARNING if outcome == "failed" else logging.INFO,
               "job %s %s %s in %.2f s (key %s, worker %s)", job_id, stage, outcome, seconds,
               key[:12], worker, extra=fields)
