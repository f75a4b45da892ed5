"""The real embedded service (`kiln serve`: API, SQLite, in-process CPU worker) as a
subprocess on a free port, private to a test, so a test can also kill it."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx

from tests.service.helpers import REPO as ROOT
from tests.service.helpers import Proc, free_port, start_api

__all__ = ["ROOT", "ServiceProcess"]

ADMIN_TOKEN = "kiln-test-admin"


class ServiceProcess:
    """`kiln serve` (`tests.service.helpers.start_api`) with its own SQLite file and kernel
    directory under `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.url = ""
        self.proc: Proc | None = None

    def start(self, timeout: float = 90.0) -> ServiceProcess:
        """Start and wait until `/healthz` answers (raises with the log tail if not)."""
        self.proc, self.url = start_api(
            self.workdir, free_port(), timeout=timeout,
            KILN_DATABASE_URL=f"sqlite:///{self.workdir / 'kiln.db'}",
            KILN_ADMIN_TOKEN=ADMIN_TOKEN, KILN_KERNEL_DIR=str(self.workdir / "kernels"),
            PYTHONUNBUFFERED="1")
        return self

    def get(self, path: str) -> tuple[int, Any]:
        """GET `path` with the admin token; (status, decoded JSON)."""
        response = httpx.get(self.url + path, timeout=10,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        return response.status_code, response.json() if response.content else None

    def kill(self) -> None:
        """Die at once, as a crashed service does (SIGKILL)."""
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL)

    def stop(self) -> None:
        """Terminate politely, then kill."""
        if self.proc is not None:
            self.proc.stop()

    def log(self) -> str:
        """The tail of the service's output."""
        return self.proc.log() if self.proc is not None else ""
