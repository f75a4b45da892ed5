"""The real embedded service (`kiln serve`: API, SQLite, in-process CPU worker) as a
subprocess on a free port, private to a test, so a test can also kill it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.kiln.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


class ServiceProcess:
    """`python -m kiln.cli serve` with its own SQLite file under `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> ServiceProcess:
        """Start and wait until `/healthz` answers (raises with the log tail if not)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        env.update(KILN_DATABASE_URL=f"sqlite:///{self.workdir / 'kiln.db'}",
                   KILN_ADMIN_TOKEN="kiln-test-admin", TRITON_INTERPRET="1",
                   KILN_KERNEL_DIR=str(self.workdir / "kernels"), PYTHONUNBUFFERED="1")
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kiln.cli", "serve", "--host", "127.0.0.1",
             "--port", str(self.port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln serve exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if self.get("/healthz")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"kiln serve did not answer /healthz in {timeout}s:\n{self.log()}")

    def get(self, path: str) -> tuple[int, Any]:
        """GET `path` with the admin token; (status, decoded JSON)."""
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": "Bearer kiln-test-admin"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def kill(self) -> None:
        """Die at once, as a crashed service does (SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """Terminate politely, then kill."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        """The tail of the service's output."""
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""
