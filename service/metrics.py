"""Prometheus metrics and the ASGI middleware that records requests."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
REQUESTS = Counter("kiln_http_requests_total", "HTTP requests", ["method", "route", "status"],
                   registry=REGISTRY)
LATENCY = Histogram("kiln_http_request_seconds", "HTTP request latency", ["route"],
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5),
                    registry=REGISTRY)
LOOKUPS = Counter("kiln_lookups_total", "Schedule lookups by outcome", ["outcome"],
                  registry=REGISTRY)
SUBMISSIONS = Counter("kiln_submissions_total", "Graph submissions", ["result"], registry=REGISTRY)
QUEUE_DEPTH = Gauge("kiln_queue_depth", "Unsettled messages per stream", ["stream"],
                    registry=REGISTRY)
# Read from the database at scrape time: workers run in other processes.
ENTRIES = Gauge("kiln_entries", "Schedule entries by status", ["status"], registry=REGISTRY)
JOBS = Gauge("kiln_jobs", "Jobs by stage and status", ["stage", "status"], registry=REGISTRY)
WORKERS = Gauge("kiln_workers_alive", "Workers with a recent heartbeat", ["device"],
                registry=REGISTRY)


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
