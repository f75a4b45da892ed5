"""`POST /v1/graphs`: submit a graph for a target; dedupe by tuning key."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from service import store
from service.api.deps import Client, Ctx
from service.context import ServiceContext
from service.intake import body_weight, intake_child, limiter_of, read_body
from service.metrics import LOOKUPS, SUBMISSIONS
from service.models import JobRow
from service.queue import QueueUnavailable
from service.store import Submission

router = APIRouter(prefix="/v1", tags=["graphs"])

_BODY_SCHEMA = {
    "required": True,
    "content": {"application/json": {"schema": {
        "type": "object", "required": ["graph", "target"],
        "properties": {
            "graph": {"type": "object", "description": "a kiln.graph/1 document"},
            "target": {"type": "object", "description": "Target.to_json()"},
            "tag": {"type": "string", "maxLength": 200},
        }}}},
}


def _hit(session: Session, sub: Submission, owner: str | None) -> tuple[int, dict] | None:
    """The answer for a graph whose entry has a schedule (recorded as a hit); None when
    it has none."""
    entry = store.schedule_by_key(session, sub.key)
    if entry is None or entry.status not in store.READY:
        return None
    store.restore_wire(session, sub)  # if retention dropped it
    job = store.job_by_key(session, sub.key)
    if job is not None and owner is not None:
        store.add_job_owner(session, job.id, owner)
    store.count_lookup(session, "hit")
    LOOKUPS.labels("hit").inc()
    SUBMISSIONS.labels("known").inc()
    return _answer(entry.key, entry.status, entry.schedule, job)


def _known(ctx: ServiceContext, sub: Submission, owner: str | None) -> tuple[int, dict] | None:
    with ctx.transaction() as session:
        return _hit(session, sub, owner)


def _record(ctx: ServiceContext, sub: Submission, owner: str | None,
            tenant: str) -> tuple[int, dict]:
    with ctx.transaction() as session:
        hit = _hit(session, sub, owner)  # it may have become ready while we validated
        if hit is not None:
            return hit
        reason = store.miss_reason(session, sub.key, sub.graph_hash, sub.target)
        entry, job, enqueue = store.submit(session, sub, tenant=tenant)
        if owner is not None:
            store.add_job_owner(session, job.id, owner)
        store.count_lookup(session, reason)
        LOOKUPS.labels(reason).inc()
        if enqueue:  # on commit: a worker must find the row
            store.enqueue_after_commit(session, job.stage, entry.queue_class, job.id,
                                       job.tenant, marked=job.needs_enqueue)
    SUBMISSIONS.labels("new" if enqueue else "joined").inc()
    if enqueue and job.id in store.unqueued(session):
        # The job is recorded and marked for recovery; the client is told to retry (503).
        raise QueueUnavailable(f"job {job.id} could not be enqueued")
    status = entry.status if entry.status in store.READY else (
        "failed" if entry.status == "failed" else "pending")
    return _answer(entry.key, status, entry.schedule, job)


def _answer(key: str, status: str, schedule: str | None, job: JobRow | None) -> tuple[int, dict]:
    # The job's state, read with the schedule: a client waiting for a tuned schedule learns
    # from this answer alone that none is coming (job done), without two more round trips.
    body = {"key": key, "status": status, "job_id": job.id if job else None,
            "job_status": job.status if job else None,
            "schedule": json.loads(schedule) if schedule else None}
    return (200 if status == "tuned" else 202), body


@router.post("/graphs", openapi_extra={"requestBody": _BODY_SCHEMA},
             responses={200: {"description": "tuned schedule"}, 202: {"description": "pending"},
                        413: {"description": "too large"}, 422: {"description": "bad graph"}})
async def submit_graph(request: Request, ctx: Ctx, who: Client) -> JSONResponse:
    """Submit `{"graph", "target", "tag"?}`: 200 with the tuned schedule, else 202 with the
    job (and the heuristic schedule once there is one). One job per tuning key; the caller
    becomes one of its owners, who alone (with admins) may read it."""
    limit = ctx.settings.body_limit
    async with limiter_of(request).admit(body_weight(request, limit)):
        body = await read_body(request, limit)
        async with intake_child(request) as child:  # decoded and validated off this process
            sub = await child.submission(body)
            del body
            # A graph with a schedule passed validation when it was first stored, and this
            # one has its canonical text: answer without running its ops again (every rank
            # of every job submits every graph at its start).
            known = await run_in_threadpool(_known, ctx, sub, who.owner)
            await child.finish(validate=known is None)
    status, answer = known or await run_in_threadpool(_record, ctx, sub, who.owner,
                                                            who.tenant)
    return JSONResponse(answer, status_code=status)
