"""Private Redis and PostgreSQL instances for fault tests (never the shared ones)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.service.helpers import free_port


def _need(binary: str) -> str:
    path = shutil.which(binary) if "/" not in binary else (binary if os.path.exists(binary) else None)
    if path is None:
        message = f"{binary} is not installed; the fault tests start private instances with it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


class PrivateRedis:
    """redis-server on a free port without persistence: a restart loses everything."""

    def __init__(self) -> None:
        self.binary = _need("redis-server")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="kiln-redis-")
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, run as the postgres user."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        self.bin = Path(_need(found[-1] if found else "/usr/lib/postgresql/initdb")).parent
        _need("runuser")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                           "-U", "postgres", "--no-sync", "-E", "UTF8"])

    def _as_postgres(self, args: list[str]) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts,
                           "-l", str(self.dir / "log"), "-w", "start"])

    def stop(self) -> None:
        self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                           "-w", "stop"])

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)
