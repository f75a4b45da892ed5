"""Helpers for service tests: databases, submissions, service processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from service import store
from service.store import Submission

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_submission(graph_hash: str | None = None, arch: str = "cpu", name: str = "cpu",
                    torch_v: str = "2.13", triton_v: str = "3.9.0", comp: str = "1",
                    tag: str | None = None) -> Submission:
    """A submission with made-up keys, for tests of the store and queue (no compiler)."""
    graph_hash = graph_hash or uuid.uuid4().hex * 2
    target = {"device_type": "cpu" if arch == "cpu" else "cuda", "arch": arch, "name": name,
              "torch": torch_v, "triton": triton_v, "compiler": comp}
    key = uuid.uuid5(uuid.NAMESPACE_OID, graph_hash + repr(sorted(target.items()))).hex * 2
    return Submission(key=key, graph_hash=graph_hash, target=target,
                      queue_class="cpu" if arch == "cpu" else f"cuda-{arch}",
                      wire='{"format":"kiln.graph/1"}', op_summary={"aten.add.Tensor": 1},
                      num_nodes=1, tag=tag)


def service_env(**extra: str) -> dict[str, str]:
    """Environment for a child service process: this interpreter, the repo on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = str(REPO)
    env["TRITON_INTERPRET"] = "1"
    env.update(extra)
    return env


class Proc:
    """A `kiln` subprocess (serve or worker) with its log in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path,
                 module: str = "kiln.cli") -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                                      cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int | None = None, timeout: float = 20) -> None:
        if self.popen.poll() is None:
            if sig is None:
                self.popen.terminate()
            else:
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()


def start_api(tmp: Path, port: int, timeout: float = 60, **env: str) -> tuple[Proc, str]:
    """Start `kiln serve` and wait until /healthz answers; returns (process, base URL)."""
    proc = Proc(["serve", "--port", str(port)], service_env(**env), tmp / f"api-{port}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url), timeout, lambda: f"API did not start:\n{proc.log()}",
                 proc=proc)
    except AssertionError:
        proc.stop()
        raise
    return proc, url


def start_worker(tmp: Path, name: str, delay: float | None = None, die: bool = False,
                 device: str = "cpu", **env: str) -> Proc:
    """Start `kiln worker --device cpu`, or with `delay` the stand-in worker (which with
    `die` exits abruptly inside every job): a build worker, or with `device` cuda:N a fake
    GPU worker for `cuda-sm_90` whose stand-in tuner reports that device."""
    if delay is None:
        return Proc(["worker", "--device", "cpu"], service_env(**env), tmp / f"worker-{name}.log")
    return Proc(["--delay", str(delay), "--device", device, *(["--die"] if die else [])],
                service_env(**env), tmp / f"worker-{name}.log", module="tests.service.worker_proc")


def job_dict(ctx: Any, job_id: int) -> dict[str, Any]:
    """The job as `GET /v1/jobs/{id}` shows it, read in a transaction of its own."""
    with ctx.transaction() as session:
        return store.job_dict(session, store.job_by_id(session, job_id))


@contextmanager
def running(worker: Any, join_s: float = 10) -> Iterator[Any]:
    """A `service.worker.Worker` running in its thread for the body; stopped and joined
    after it, even when the body fails."""
    worker.start_thread()
    try:
        yield worker
    finally:
        worker.stop()
        worker.join(join_s)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate: Any, timeout: float, message: Any = "timed out", proc: Proc | None = None,
             interval: float = 0.1) -> Any:
    """Poll until `predicate()` is truthy; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.popen.poll() is not None:
            break
        time.sleep(interval)
    raise AssertionError(message() if callable(message) else message)


def wire_body(case_name: str = "mlp.fwd", target: dict[str, str] | None = None,
              tag: str | None = None) -> dict[str, Any]:
    """A `POST /v1/graphs` body for a corpus graph (CPU target unless one is given)."""
    import compiler
    from tests.corpus import case

    c = case(case_name)
    body: dict[str, Any] = {"graph": compiler.to_wire(c.gm, c.example_inputs),
                            "target": target or compiler.Target.detect("cpu").to_json()}
    if tag is not None:
        body["tag"] = tag
    return body


def gpu_target(arch: str = "sm_90", name: str = "NVIDIA H200") -> dict[str, str]:
    """The target of a GPU that is not here."""
    import compiler

    return compiler.Target.named(arch, name=name).to_json()
