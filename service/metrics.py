"""Prometheus metrics and the ASGI middleware that records requests.

Several API processes (`kiln serve --workers N`) share one exposition: with
`PROMETHEUS_MULTIPROC_DIR` set before this module is imported (`kiln serve` sets it for
N > 1), every process writes its values to files there and `exposition()` sums them, so a
counter never jumps back between two scrapes that land on different processes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

__all__ = ["CONTENT_TYPE_LATEST", "exposition", "observe_job", "timed"]

REGISTRY = CollectorRegistry(auto_describe=True)
# Gauges read from the database at scrape time: every process sets the same values, the
# latest write is the answer.
_DB_GAUGE: dict[str, Any] = {"multiprocess_mode": "mostrecent"}
_DURATIONS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
REQUESTS = Counter("kiln_http_requests_total", "HTTP requests", ["method", "route", "status"],
                   registry=REGISTRY)
LATENCY = Histogram("kiln_http_request_seconds", "HTTP request latency", ["route"],
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5),
                    registry=REGISTRY)
LOOKUPS = Counter("kiln_lookups_total", "Schedule lookups by outcome", ["outcome"],
                  registry=REGISTRY)
SUBMISSIONS = Counter("kiln_submissions_total", "Graph submissions", ["result"], registry=REGISTRY)
PLAN_LOOKUPS = Counter("kiln_plan_lookups_total", "Plan fetches by outcome (hit, miss)",
                       ["outcome"], registry=REGISTRY)
PLAN_STORES = Counter("kiln_plan_stores_total", "Plan uploads by result (created, known)",
                      ["result"], registry=REGISTRY)
QUEUE_DEPTH = Gauge("kiln_queue_depth", "Unsettled messages per stream", ["stream"],
                    registry=REGISTRY, **_DB_GAUGE)
# Read from the database at scrape time: workers run in other processes.
ENTRIES = Gauge("kiln_entries", "Schedule entries by status", ["status"], registry=REGISTRY,
                **_DB_GAUGE)
JOBS = Gauge("kiln_jobs", "Jobs by stage and status", ["stage", "status"], registry=REGISTRY,
             **_DB_GAUGE)
WORKERS = Gauge("kiln_workers_alive", "Workers with a recent heartbeat", ["device"],
                registry=REGISTRY, **_DB_GAUGE)
# Observed where the work runs: in the API process for its embedded worker; a separate
# worker process records into its own registry.
JOB_SECONDS = Histogram("kiln_job_seconds", "Time a job stage took, from claim to end",
                        ["stage", "outcome"], buckets=_DURATIONS, registry=REGISTRY)
STEP_SECONDS = Histogram("kiln_step_seconds", "Time of one step of a job: build (lower, fuse, "
                         "generate, check, and the target_compile inside it), target_compile "
                         "(compile for the target's GPU, in a build or a tune job), tune (search "
                         "and its target_compile)",
                         ["step"], buckets=_DURATIONS, registry=REGISTRY)
STEPS = ("build", "target_compile", "tune")


def observe_job(stage: str, outcome: str, seconds: float) -> None:
    """Record a finished job stage (`stage` build|tune, `outcome` done|failed|retry)."""
    JOB_SECONDS.labels(stage, outcome).observe(seconds)


@contextmanager
def timed(step: str) -> Iterator[None]:
    """Time the block into `kiln_step_seconds{step}` (one of STEPS), also when it raises."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, not {step!r}")
    start = time.perf_counter()
    try:
        yield
    finally:
        STEP_SECONDS.labels(step).observe(time.perf_counter() - start)


def exposition() -> bytes:
    """The Prometheus text of this process, or of all API processes in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)


class MetricsMiddleware:
    """Counts and times every HTTP request by its route template (bounded label values)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            REQUESTS.labels(scope["method"], route, str(status[0])).inc()
            LATENCY.labels(route).observe(time.perf_counter() - start)
