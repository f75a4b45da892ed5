"""A live kiln service for the browser tests: the real app under uvicorn in a thread, real
workers in threads, real graphs built and tuned on the CPU (Triton interpreter)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import torch
import uvicorn

from service import store
from service.api.app import create_app
from service.context import ServiceContext
from service.worker import Worker
from tests.service.helpers import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll until `predicate()` is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class LiveService:
    """`create_app` served by uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(ctx=ctx), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="kiln-live-api", daemon=True)
        self.workers: list[Worker] = []

    def __enter__(self) -> LiveService:
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "the API to start")
        return self

    def __exit__(self, *_exc: object) -> None:
        for worker in self.workers:
            worker.stop()
        for worker in self.workers:
            worker.join(30)
        self.server.should_exit = True
        self.thread.join(30)

    def start_worker(self, **kwargs: Any) -> Worker:
        """A real service worker in a thread (`Worker(ctx, **kwargs)`)."""
        worker = Worker(self.ctx, block_s=0.2, **kwargs)
        worker.start_thread()
        self.workers.append(worker)
        return worker

    def submit(self, fn: Callable[..., Any], inputs: list[torch.Tensor], tag: str,
               target: dict[str, str] | None = None) -> dict[str, Any]:
        """Trace `fn` to an aten graph and POST it as a client would; the JSON answer."""
        import compiler
        from compiler.lowering.tracing import trace_inference

        gm, example = trace_inference(fn, inputs)
        body = {"graph": compiler.to_wire(gm, example), "tag": tag,
                "target": target or compiler.Target.detect("cpu").to_json()}
        response = httpx.post(f"{self.url}/v1/graphs", json=body, timeout=30)
        assert response.status_code in (200, 202), response.text
        return response.json()

    def schedule_status(self, key: str) -> tuple[int, dict[str, Any]]:
        """`GET /v1/schedules/{key}` as a client sees it."""
        response = httpx.get(f"{self.url}/v1/schedules/{key}", timeout=10)
        return response.status_code, response.json()

    def wait_status(self, key: str, status: str, timeout: float) -> None:
        """Wait until the entry's schedule has `status` (heuristic or tuned)."""
        def ready() -> bool:
            code, body = self.schedule_status(key)
            return code == 200 and body.get("status") == status
        try:
            wait_for(ready, timeout, f"entry {key[:12]} to be {status}")
        except AssertionError:
            with self.ctx.transaction() as session:
                job = store.job_by_key(session, key)
                detail = store.job_dict(session, job) if job else None
            raise AssertionError(f"entry {key[:12]} not {status}; job: {detail}") from None

    def send_to_tuning(self, key: str) -> None:
        """Queue the entry's job for its tuning stage. The service routes CPU targets to
        the build stage only, so the test hands the built job to the tune stream itself,
        exactly as the CPU worker does for a GPU target that a GPU worker serves."""
        with self.ctx.transaction() as session:
            job = store.job_by_key(session, key)
            entry = store.schedule_by_key(session, key)
            assert job is not None and entry is not None
            store.requeue(session, job, "tune", "tuning on the CPU (Triton interpreter)")
            store.enqueue_after_commit(session, "tune", entry.queue_class, job.id, job.tenant)
