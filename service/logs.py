"""Log set-up for service processes: plain text, or one JSON object a line (KILN_LOG_FORMAT=json)
for log collectors."""

from __future__ import annotations

import json
import logging
import os


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"t": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "logger": record.name, "message": record.getMessage(), "pid": record.process}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str = "info", fmt: str | None = None) -> None:
    """Configure the root logger once for a service process."""
    fmt = fmt or os.environ.get("KILN_LOG_FORMAT", "text")
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # start-up chatter
