"""`/healthz`, `/readyz`, `/metrics`."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service import admin_queries
from service.api.deps import Client, Ctx
from service.metrics import ENTRIES, JOBS, QUEUE_DEPTH, REGISTRY, WORKERS
from service.queue import QueueUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: Ctx) -> JSONResponse:
    """200 when the database and the queue answer, else 503 naming what is down."""
    checks: dict[str, str] = {}
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # any failure means not ready
        checks["database"] = f"down: {type(exc).__name__}"
    try:
        ctx.queue.ping()
        checks["queue"] = "ok"
    except QueueUnavailable as exc:
        checks["queue"] = f"down: {exc}"
    ready = all(v == "ok" for v in checks.values())
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
    with ctx.transaction() as session:
        stats = admin_queries.stats(session)
        for status, n in stats["entries_by_status"].items():
            ENTRIES.labels(status).set(n)
        for (stage, status), n in admin_queries.job_counts(session).items():
            JOBS.labels(stage, status).set(n)
    alive: dict[str, int] = {}
    for w in stats["workers"]:
        if w["status"] == "running" and w["heartbeat_age_s"] < max(3 * ctx.settings.heartbeat_s, 15):
            kind = "cpu" if w["device"] == "cpu" else "cuda"
            alive[kind] = alive.get(kind, 0) + 1
    for kind in ("cpu", "cuda"):
        WORKERS.labels(kind).set(alive.get(kind, 0))
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
