"""Graphs and entries: submissions, lookups, hit counters, published schedules and their
kernels and measurements. Callers own the transaction."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db import insert_ignore, upsert_add
from service.models import (
    GraphRow,
    JobOwnerRow,
    JobRow,
    KernelRow,
    LookupCountRow,
    MeasurementRow,
    ScheduleRow,
    utcnow,
)
from service.store.jobs import WIRE_PRUNED, add_event, enqueue_after_commit, job_by_key, requeue
from service.tenants import DEFAULT_TENANT

READY = ("heuristic", "tuned")
MISS_REASONS = ("unknown_graph", "other_gpu", "other_versions", "other_compiler")


@dataclass(frozen=True)
class Submission:
    """A validated `POST /v1/graphs` body, reduced to what the database stores."""

    key: str
    graph_hash: str
    target: dict[str, str]  # Target.to_json()
    queue_class: str
    wire: str  # canonical JSON text of the graph
    op_summary: dict[str, int]
    num_nodes: int
    tag: str | None = None


def minute(at: datetime) -> datetime:
    """The stats bucket an instant falls in."""
    return at.replace(second=0, microsecond=0)


def schedule_by_key(session: Session, key: str) -> ScheduleRow | None:
    """The entry for a key, or None."""
    return session.scalars(select(ScheduleRow).where(ScheduleRow.key == key)).one_or_none()


def submit(session: Session, sub: Submission,
           tenant: str = DEFAULT_TENANT) -> tuple[ScheduleRow, JobRow, bool]:
    """Record a submission by `tenant`; returns (entry, job, enqueue). Exactly one concurrent
    caller per key gets enqueue=True: the unique constraints on graphs, schedules and jobs
    decide, and the job keeps that caller's tenant (its turn in the queue). The caller
    enqueues the job (enqueue_after_commit) when enqueue is True."""
    now = utcnow()
    known_graph = not insert_ignore(session, GraphRow.__table__, dict(
        graph_hash=sub.graph_hash, wire=sub.wire, op_summary=sub.op_summary,
        num_nodes=sub.num_nodes, created_at=now))
    t = sub.target
    insert_ignore(session, ScheduleRow.__table__, dict(
        key=sub.key, graph_hash=sub.graph_hash, device_type=t["device_type"], arch=t["arch"],
        device_name=t["name"], torch_version=t["torch"], triton_version=t["triton"],
        compiler_version=t["compiler"], queue_class=sub.queue_class, status="pending",
        tag=sub.tag, hits=0, created_at=now, updated_at=now))
    enqueue = insert_ignore(session, JobRow.__table__, dict(
        key=sub.key, stage="build", status="queued", progress=0.0, attempts=0, tenant=tenant,
        created_at=now, updated_at=now))
    job = job_by_key(session, sub.key)
    assert job is not None  # inserted above or by a concurrent submitter
    if enqueue:
        add_event(session, job, "queued", None, "submitted")
    else:
        # An invalidated entry is built again when its graph comes back; one caller wins.
        reset = session.execute(
            update(ScheduleRow).where(ScheduleRow.key == sub.key, ScheduleRow.status == "invalidated")
            .values(status="pending", schedule=None, updated_at=now)
        ).rowcount
        if reset:
            requeue(session, job, "build", "resubmitted after invalidation")
            enqueue = True
    if known_graph:
        restore_wire(session, sub)  # after the reset above, so a job is queued once
    entry = schedule_by_key(session, sub.key)
    assert entry is not None
    session.refresh(entry)
    session.refresh(job)
    if not enqueue and job.status == "queued" and job.needs_enqueue:
        enqueue = True  # its first enqueue failed: this submission puts it on the queue
    return entry, job, enqueue


def restore_wire(session: Session, sub: Submission) -> None:
    """Store the wire form of a known graph again if retention dropped it, and queue again
    the jobs of its entries that failed for want of it."""
    if not session.execute(update(GraphRow).where(
            GraphRow.graph_hash == sub.graph_hash, GraphRow.wire.is_(None))
            .values(wire=sub.wire)).rowcount:
        return
    stranded = session.execute(
        select(JobRow, ScheduleRow.queue_class).join(ScheduleRow, ScheduleRow.key == JobRow.key)
        .where(ScheduleRow.graph_hash == sub.graph_hash, JobRow.status == "failed",
               JobRow.error == WIRE_PRUNED)).all()
    for job, queue_class in stranded:
        session.execute(update(ScheduleRow).where(ScheduleRow.key == job.key,
                                                  ScheduleRow.status == "failed")
                        .values(status="pending", updated_at=utcnow()))
        requeue(session, job, job.stage, "graph submitted again: its wire form is back")
        enqueue_after_commit(session, job.stage, queue_class, job.id, job.tenant)


def add_job_owner(session: Session, job_id: int, owner: str) -> None:
    """Record that `owner` (a token's hash) submitted this job's key."""
    insert_ignore(session, JobOwnerRow.__table__, {"job_id": job_id, "owner": owner})


def job_visible(session: Session, job_id: int, owner: str) -> bool:
    """Whether `owner` submitted this job's key (and so may read the job)."""
    return session.get(JobOwnerRow, (job_id, owner)) is not None


def miss_reason(session: Session, key: str, graph_hash: str, target: dict[str, str]) -> str:
    """Why a lookup missed: compare with the entries of the same graph on other targets."""
    rows = session.execute(
        select(ScheduleRow.arch, ScheduleRow.device_name, ScheduleRow.torch_version,
               ScheduleRow.triton_version, ScheduleRow.compiler_version)
        .where(ScheduleRow.graph_hash == graph_hash, ScheduleRow.key != key)
    ).all()
    if not rows:
        return "unknown_graph"
    same_gpu = [r for r in rows if (r.arch, r.device_name) == (target["arch"], target["name"])]
    if not same_gpu:
        return "other_gpu"
    if any((r.torch_version, r.triton_version) == (target["torch"], target["triton"]) for r in same_gpu):
        return "other_compiler"
    return "other_versions"


def count_lookup(session: Session, kind: str, amount: int = 1, at: datetime | None = None) -> None:
    """Add to the per-minute counter of hits (kind='hit') or misses by reason."""
    upsert_add(session, LookupCountRow.__table__, {"bucket": minute(at or utcnow()), "kind": kind},
               "count", amount)


def record_hits(session: Session, hits: dict[str, int], last_used: dict[str, datetime]) -> None:
    """Flush buffered per-key hit counts (the API batches them off the request path)."""
    for key, n in sorted(hits.items()):
        session.execute(update(ScheduleRow).where(ScheduleRow.key == key).values(
            hits=ScheduleRow.hits + n, last_used_at=last_used[key]))


def job_input(session: Session, key: str) -> tuple[str | None, ScheduleRow]:
    """What a worker needs to run the job of `key`: the graph's wire form (None when
    retention dropped it) and the entry (its target and queue class)."""
    wire, entry = session.execute(
        select(GraphRow.wire, ScheduleRow)
        .join(ScheduleRow, ScheduleRow.graph_hash == GraphRow.graph_hash)
        .where(ScheduleRow.key == key)).one()
    return wire, entry


def set_entry_status(session: Session, key: str, status: str, clear_schedule: bool = False) -> None:
    """Set an entry's status (invalidate, or back to pending for a fresh build), dropping
    its schedule when asked."""
    values: dict[str, Any] = {"status": status, "updated_at": utcnow()}
    if clear_schedule:
        values["schedule"] = None
    session.execute(update(ScheduleRow).where(ScheduleRow.key == key).values(**values))


def publish_schedule(session: Session, key: str, status: str, schedule: dict[str, Any],
                     kernels: list[dict[str, Any]], timings: dict[str, float | None]) -> bool:
    """Store a schedule (`heuristic` or `tuned`) and its kernels. A heuristic never replaces a
    tuned schedule, and nothing revives an invalidated entry. True when stored."""
    allowed = ("pending", "failed", "heuristic") if status == "heuristic" else (
        "pending", "failed", "heuristic", "tuned")
    now = utcnow()
    schedule = {**schedule, "status": status}
    values: dict[str, Any] = {"status": status, "schedule": json.dumps(schedule, sort_keys=True),
                              "updated_at": now}
    values.update({k: v for k, v in timings.items() if v is not None})
    stored = session.execute(update(ScheduleRow).where(
        ScheduleRow.key == key, ScheduleRow.status.in_(allowed)).values(**values)).rowcount
    if not stored:
        return False
    old = {k.name: k for k in session.scalars(select(KernelRow).where(KernelRow.schedule_key == key))}
    for k in old.values():
        session.delete(k)
    session.flush()
    for i, k in enumerate(kernels):
        previous = old.get(k["name"])
        # Compile facts belong to one source and config: kept when the tuner changed neither.
        same_binary = previous is not None and previous.source_hash == k.get("source_hash") \
            and previous.config == k.get("config", {})
        session.add(KernelRow(
            schedule_key=key, position=i, name=k["name"], kind=k.get("kind", ""),
            variant=k.get("variant", ""), config=k.get("config", {}), nodes=k.get("nodes", []),
            ops=k.get("ops", []), source=k.get("source"), source_hash=k.get("source_hash"),
            heuristic_ms=k.get("heuristic_ms", previous.heuristic_ms if previous else None),
            tuned_ms=k.get("tuned_ms"),
            compiled=k.get("compiled") or (previous.compiled if same_binary else None)))
    return True


def add_measurements(session: Session, key: str, job_id: int | None, worker: str,
                     measurements: list[dict[str, Any]]) -> None:
    """Store every candidate measured while tuning."""
    now = utcnow()
    for m in measurements:
        session.add(MeasurementRow(
            schedule_key=key, job_id=job_id, worker_id=worker, kernel=str(m.get("kernel", "")),
            variant=m.get("variant"), config=m.get("config") or {}, ms=m.get("ms"),
            error=m.get("error"), verified=bool(m.get("verified", False)), at=now))
