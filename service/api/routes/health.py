"""`/healthz`, `/readyz`, `/metrics`."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from service.api.deps import Client, Ctx, client_principal
from service.context import ServiceContext
from service.metrics import CONTENT_TYPE_LATEST, ENTRIES, JOBS, QUEUE_DEPTH, WORKERS, exposition
from service.queue import QueueUnavailable
from service.store import admin, lookup

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process answers (on the event loop: never queued behind the thread pool)."""
    return {"status": "ok"}


def _checks(ctx: ServiceContext) -> dict[str, str]:
    """Each dependency `ok` or `down: <what kind of failure>`; never an address or a
    password (the full error goes to the log)."""
    checks: dict[str, str] = {}
    try:
        lookup.ping(ctx.engine)
        checks["database"] = "ok"
    except Exception as exc:  # any failure means not ready
        log.warning("readiness: database down: %s", exc)
        checks["database"] = f"down: {type(exc).__name__}"
    try:
        ctx.queue.ping()
        checks["queue"] = "ok"
    except QueueUnavailable as exc:
        log.warning("readiness: queue down: %s", exc)
        checks["queue"] = "down: it does not answer"
    return checks


@router.get("/readyz")
async def readyz(request: Request, ctx: Ctx) -> JSONResponse:
    """200 when the database and the queue answer, else 503. Which one is down is shown on
    loopback or to a caller with a token; on a public bind anyone else gets only the status."""
    checks = await run_in_threadpool(_checks, ctx)
    ready = all(v == "ok" for v in checks.values())
    if not ctx.settings.loopback and request.headers.get("authorization") is None:
        return JSONResponse({"status": "ready" if ready else "not_ready"},
                            status_code=200 if ready else 503)
    if not ctx.settings.loopback:
        await client_principal(request)  # a presented token must be valid to see details
    if ready:
        return JSONResponse({"status": "ready", "checks": checks})
    return JSONResponse({"error": {"code": "not_ready", "message": "; ".join(
        f"{k} {v}" for k, v in checks.items() if v != "ok")}, "checks": checks}, status_code=503)


@router.get("/metrics")
def metrics(ctx: Ctx, _who: Client) -> Response:
    """Prometheus exposition (needs a token unless the API is bound to loopback)."""
    try:
        for stream, n in ctx.queue.depth().items():
            QUEUE_DEPTH.labels(stream).set(n)
    except QueueUnavailable:
        pass
    with ctx.transaction() as session:  # three small queries, not the stats page's
        for status, n in admin.entries_by_status(session).items():
            ENTRIES.labels(status).set(n)
        for (stage, status), n in admin.job_counts(session).items():
            JOBS.labels(stage, status).set(n)
        workers = admin.recent_workers(session)
    alive: dict[str, int] = {}
    for w in workers:
        if w["status"] == "running" and w["heartbeat_age_s"] < max(3 * ctx.settings.heartbeat_s, 15):
            kind = "cpu" if w["device"] == "cpu" else "cuda"
            alive[kind] = alive.get(kind, 0) + 1
    for kind in ("cpu", "cuda"):
        WORKERS.labels(kind).set(alive.get(kind, 0))
    return Response(exposition(), media_type=CONTENT_TYPE_LATEST)
