"""Admin reads (and the two admin writes, invalidate and re-tune), shared by the `/v1/admin`
routes and the `/admin` dashboard.

Every function takes a SQLAlchemy Session and returns plain dicts (docs/contracts.md,
"Admin API"). Callers own the transaction; nothing here commits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from service.models import (
    GraphRow,
    JobRow,
    KernelRow,
    LookupCountRow,
    MeasurementRow,
    ScheduleRow,
    WorkerRow,
    utcnow,
)
from service.queue import QueueUnavailable
from service.store import entries as store_entries
from service.store import jobs as store_jobs
from service.store.plans import count_plans

STATUSES = ("pending", "heuristic", "tuned", "failed", "invalidated")
_BEST_MS = func.coalesce(ScheduleRow.tuned_ms, ScheduleRow.heuristic_ms)
_SPEEDUP = ScheduleRow.eager_ms / func.nullif(_BEST_MS, 0)
SORTS = {
    "last_used": ScheduleRow.last_used_at, "created": ScheduleRow.created_at,
    "hits": ScheduleRow.hits, "key": ScheduleRow.key, "status": ScheduleRow.status,
    "tuned_ms": ScheduleRow.tuned_ms, "speedup": _SPEEDUP, "tag": ScheduleRow.tag,
    "tuning_s": ScheduleRow.tuning_s,
}
MAX_PER_PAGE = 500
SERIES_MINUTES = 60


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def entry_item(row: ScheduleRow) -> dict[str, Any]:
    """One entry as the list shows it."""
    best = row.tuned_ms if row.tuned_ms is not None else row.heuristic_ms
    speedup = row.eager_ms / best if row.eager_ms and best else None
    return {
        "key": row.key, "graph_hash": row.graph_hash, "status": row.status,
        "target": {"device_type": row.device_type, "arch": row.arch, "name": row.device_name,
                   "torch": row.torch_version, "triton": row.triton_version,
                   "compiler": row.compiler_version},
        "queue_class": row.queue_class, "tag": row.tag,
        "created_at": _iso(row.created_at), "last_used_at": _iso(row.last_used_at),
        "hits": row.hits, "eager_ms": row.eager_ms, "heuristic_ms": row.heuristic_ms,
        "tuned_ms": row.tuned_ms, "speedup": speedup, "tuning_s": row.tuning_s,
    }


def list_entries(session: Session, q: str | None = None, target: str | None = None,
                 status: str | None = None, tag: str | None = None, sort: str = "last_used",
                 order: str = "desc", page: int = 1, per_page: int = 50) -> dict[str, Any]:
    """A page of entries. `q`: key or graph-hash prefix; `target`: queue class, arch or device
    name; raises ValueError on an unknown status, sort or order, or a bad page."""
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}")
    if order not in ("asc", "desc"):
        raise ValueError("order must be asc or desc")
    if page < 1 or not 1 <= per_page <= MAX_PER_PAGE:
        raise ValueError(f"page must be >= 1 and per_page within 1..{MAX_PER_PAGE}")
    query = select(ScheduleRow)
    if q:
        prefix = q.strip().lower()  # autoescape: `%`, `_` and the escape char match literally
        query = query.where(or_(ScheduleRow.key.startswith(prefix, autoescape=True),
                                ScheduleRow.graph_hash.startswith(prefix, autoescape=True)))
    if target:
        query = query.where(or_(ScheduleRow.queue_class == target, ScheduleRow.arch == target,
                                ScheduleRow.device_name == target))
    if status:
        query = query.where(ScheduleRow.status == status)
    if tag:
        query = query.where(ScheduleRow.tag == tag)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    column = SORTS[sort]
    ordered = (column.desc() if order == "desc" else column.asc()).nulls_last()
    rows = session.scalars(query.order_by(ordered, ScheduleRow.key)
                           .offset((page - 1) * per_page).limit(per_page)).all()
    return {"items": [entry_item(r) for r in rows], "total": total, "page": page,
            "per_page": per_page}


def entry_detail(session: Session, key: str) -> dict[str, Any] | None:
    """One entry with its graph's op summary, kernels (with source), every measurement and
    its job; None when the key is unknown."""
    row = store_entries.schedule_by_key(session, key)
    if row is None:
        return None
    detail = entry_item(row)
    graph = session.scalars(select(GraphRow).where(GraphRow.graph_hash == row.graph_hash)).one()
    detail["op_summary"] = graph.op_summary
    detail["schedule"] = json.loads(row.schedule) if row.schedule else None
    detail["kernels"] = [
        {"name": k.name, "kind": k.kind, "variant": k.variant, "config": k.config,
         "nodes": k.nodes, "ops": k.ops, "source": k.source, "source_hash": k.source_hash,
         "heuristic_ms": k.heuristic_ms, "tuned_ms": k.tuned_ms, "compiled": k.compiled}
        for k in session.scalars(select(KernelRow).where(KernelRow.schedule_key == key)
                                 .order_by(KernelRow.position))]
    detail["measurements"] = [
        {"kernel": m.kernel, "variant": m.variant, "config": m.config, "ms": m.ms,
         "error": m.error, "verified": m.verified, "at": _iso(m.at)}
        for m in session.scalars(select(MeasurementRow).where(MeasurementRow.schedule_key == key)
                                 .order_by(MeasurementRow.id))]
    job = store_jobs.job_by_key(session, key)
    detail["jobs"] = [store_jobs.job_dict(session, job)] if job else None
    return detail


def invalidate(session: Session, key: str) -> dict[str, Any] | None:
    """Withdraw an entry: `GET /v1/schedules/{key}` answers 404 `invalidated` until the graph
    is submitted again. None when the key is unknown."""
    row = store_entries.schedule_by_key(session, key)
    if row is None:
        return None
    store_entries.set_entry_status(session, key, "invalidated")
    session.refresh(row)
    return entry_item(row)


def retune(session: Session, key: str) -> dict[str, Any] | None:
    """Queue the entry's job again: tuning on a GPU worker for a GPU target with a schedule,
    else a fresh build; it is enqueued when the transaction commits. None when unknown."""
    row = store_entries.schedule_by_key(session, key)
    job = store_jobs.job_by_key(session, key)
    if row is None or job is None:
        return None
    has_schedule = row.status in store_entries.READY
    stage = "tune" if row.device_type != "cpu" and has_schedule else "build"
    if not has_schedule:
        store_entries.set_entry_status(session, key, "pending", clear_schedule=True)
    store_jobs.requeue(session, job, stage, "re-tune requested by an admin")
    store_jobs.enqueue_after_commit(session, stage, row.queue_class, job.id, job.tenant)
    session.refresh(job)
    return store_jobs.job_dict(session, job)


def stats(session: Session, queue: Any = None) -> dict[str, Any]:
    """Counts for the stats page and `kiln stats`. `queue` is a JobQueue, a mapping of
    depths, or None; an unreachable queue gives an empty `queue_depth`. Speedups and the
    tuned fraction (tuned among GPU-target entries with a schedule) leave CPU targets out."""
    by_status = entries_by_status(session)
    totals = dict(session.execute(select(LookupCountRow.kind, func.sum(LookupCountRow.count))
                                  .group_by(LookupCountRow.kind)).all())
    reasons = {r: int(totals.get(r) or 0) for r in store_entries.MISS_REASONS}
    since = store_entries.minute(utcnow()) - timedelta(minutes=SERIES_MINUTES)
    series: dict[Any, dict[str, int]] = {}
    for bucket, kind, n in session.execute(
            select(LookupCountRow.bucket, LookupCountRow.kind, LookupCountRow.count)
            .where(LookupCountRow.bucket >= since).order_by(LookupCountRow.bucket)):
        point = series.setdefault(bucket, {"hits": 0, "misses": 0})
        point["hits" if kind == "hit" else "misses"] += n
    # CPU targets run on the interpreter, whose times are no measure of speed, and are
    # never tuned: both GPU-only.
    on_gpu = ScheduleRow.device_type != "cpu"
    speedups = [eager / tuned for eager, tuned in session.execute(
        select(ScheduleRow.eager_ms, ScheduleRow.tuned_ms)
        .where(ScheduleRow.status == "tuned", on_gpu, ScheduleRow.eager_ms > 0,
               ScheduleRow.tuned_ms > 0))]
    gpu_ready = dict(session.execute(
        select(ScheduleRow.status, func.count())
        .where(on_gpu, ScheduleRow.status.in_(store_entries.READY)).group_by(ScheduleRow.status)).all())
    tunable = sum(gpu_ready.values())
    waiting: dict[str, dict[str, int]] = {}
    for stage, status, n in session.execute(
            select(JobRow.stage, JobRow.status, func.count())
            .where(JobRow.status.in_(("queued", "running")))
            .group_by(JobRow.stage, JobRow.status)):
        waiting.setdefault(stage, {"queued": 0, "running": 0})[status] = n
    if queue is None:
        depth: dict[str, int] = {}
    elif isinstance(queue, Mapping):
        depth = dict(queue)
    else:
        try:
            depth = queue.depth()
        except QueueUnavailable:  # the counts from the database still stand
            depth = {}
    workers = recent_workers(session)
    return {
        "entries_by_status": by_status, "hits": int(totals.get("hit") or 0),
        "misses": sum(reasons.values()), "misses_by_reason": reasons,
        "hit_rate_series": [{"t": t.isoformat(), **v} for t, v in series.items()],
        "speedups": speedups, "gpu_entries_ready": tunable,
        "tuned_fraction": gpu_ready.get("tuned", 0) / tunable if tunable else None,
        "queue_depth": depth, "jobs_waiting": waiting, "workers": workers,
        "plans": count_plans(session),
    }


def entries_by_status(session: Session) -> dict[str, int]:
    """Number of entries per status (every status, 0 included)."""
    by_status = dict.fromkeys(STATUSES, 0)
    for status, n in session.execute(select(ScheduleRow.status, func.count())
                                     .group_by(ScheduleRow.status)):
        by_status[status] = n
    return by_status


def recent_workers(session: Session) -> list[dict[str, Any]]:
    """Workers heard from in the last hour, with their heartbeat's age."""
    now = utcnow()
    return [
        {"id": w.id, "device": w.device, "queue_class": w.queue_class, "status": w.status,
         "heartbeat_age_s": (now - w.heartbeat_at).total_seconds(), "current_job": w.current_job_id}
        for w in session.scalars(select(WorkerRow).where(
            WorkerRow.heartbeat_at > now - timedelta(hours=1)).order_by(WorkerRow.id))]


def list_jobs(session: Session, status: str | None = None, limit: int = 100) -> dict[str, Any]:
    """The most recent jobs, newest first, optionally of one status."""
    if status is not None and status not in ("queued", "running", "done", "failed"):
        raise ValueError("status must be queued, running, done or failed")
    if not 1 <= limit <= 1000:
        raise ValueError("limit must be within 1..1000")
    query = select(JobRow).order_by(JobRow.updated_at.desc(), JobRow.id.desc()).limit(limit)
    if status:
        query = query.where(JobRow.status == status)
    return {"items": [store_jobs.job_dict(session, j) for j in session.scalars(query)]}


def job_counts(session: Session) -> dict[tuple[str, str], int]:
    """Number of jobs per (stage, status)."""
    return {(stage, status): n for stage, status, n in session.execute(
        select(JobRow.stage, JobRow.status, func.count()).group_by(JobRow.stage, JobRow.status))}
