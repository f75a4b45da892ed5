"""The client's log: `KILN_LOG_LEVEL` sets the level of the `kiln` logger, and its lines
reach a plain user's terminal without any logging setup.

Python shows only the warnings of a logger nobody configured (its last-resort handler). So
kiln gives its logger a handler that writes to stderr while no other handler would get the
line: once the application configures logging (a handler on the root logger), kiln's
lines go to the application's handlers, and never twice. Unset, the level stays Python's
default (warnings), except for the lines of a long wait on the service (`kiln.progress`,
INFO): a first step blocked for up to two minutes without a word looks like a hang.
`KILN_LOG_LEVEL=warning` silences those too. Read once, when `kiln` is imported.

torch's `TORCH_LOGS=+kiln` (or `kiln`, `-kiln`) sets these loggers too, after this module
did (torch imports `kiln` to find its submodules), and gives them torch's handler, which
this module's then leaves the lines to.
"""

from __future__ import annotations

import logging
import os
import sys

LEVELS = ("debug", "info", "warning", "error", "critical")

log = logging.getLogger("kiln")
progress_log = logging.getLogger("kiln.progress")


class _ToStderr(logging.Handler):
    """Writes a record to stderr (as it is when the record comes: tests swap it) unless
    the application has a handler that gets it."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or any(h is not self for h in log.handlers):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging's own policy for a failing handler
            self.handleError(record)


def apply(environ: dict[str, str] | None = None) -> None:
    """Set the `kiln` loggers' levels from `KILN_LOG_LEVEL` and give them the stderr
    handler (once); a value that is not a level is one warning and the default."""
    environ = os.environ if environ is None else environ
    if not any(isinstance(h, _ToStderr) for h in log.handlers):
        log.addHandler(_ToStderr())
    value = environ.get("KILN_LOG_LEVEL", "").strip().lower()
    if value in LEVELS:
        log.setLevel(value.upper())
        progress_log.setLevel(logging.NOTSET)  # as the rest of kiln
        return
    log.setLevel(logging.NOTSET)
    progress_log.setLevel(logging.INFO)
    if value:
        log.warning("kiln: KILN_LOG_LEVEL=%r is not a level (%s or %s); keeping the default "
                    "(warnings, and progress lines)", environ["KILN_LOG_LEVEL"],
                    ", ".join(LEVELS[:-1]), LEVELS[-1])
