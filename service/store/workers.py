"""Workers: registration, heartbeats, and burying the silent ones (their jobs go back to
the queue). Callers own the transaction."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.models import JobEventRow, JobRow, ScheduleRow, WorkerRow, utcnow


def register_worker(session: Session, worker_id: str, device: str, queue_class: str) -> None:
    """Record a worker starting (or starting again under the same id)."""
    now = utcnow()
    session.merge(WorkerRow(id=worker_id, device=device, queue_class=queue_class,
                            status="running", started_at=now, heartbeat_at=now,
                            current_job_id=None))


def beat(session: Session, worker_id: str, current_job_id: int | None) -> None:
    """Record a heartbeat: the worker is running, holding `current_job_id` (or nothing)."""
    session.execute(update(WorkerRow).where(WorkerRow.id == worker_id).values(
        heartbeat_at=utcnow(), status="running", current_job_id=current_job_id))


def stop_worker(session: Session, worker_id: str) -> None:
    """Record a worker stopping cleanly."""
    session.execute(update(WorkerRow).where(WorkerRow.id == worker_id).values(
        status="stopped", current_job_id=None, heartbeat_at=utcnow()))


def gpu_serves(session: Session, queue_class: str, window_s: float) -> bool:
    """Whether a live GPU worker (a heartbeat within `window_s`) serves this target class."""
    since = utcnow() - timedelta(seconds=window_s)
    return session.scalars(select(WorkerRow.id).where(
        WorkerRow.queue_class == queue_class, WorkerRow.device != "cpu",
        WorkerRow.status == "running", WorkerRow.heartbeat_at > since).limit(1)).first() is not None


def bury_dead_workers(session: Session, silent_s: float) -> list[tuple[int, str, str, str]]:
    """Mark `dead` every running worker whose last heartbeat is older than `silent_s`, and
    put back in the queue the jobs they held whose lease has run out (the attempt counts, so
    a job that kills its workers still ends failed). Returns (job id, stage, queue class,
    tenant) of
    the jobs to enqueue once this commits; they stay marked `needs_enqueue` until then."""
    now = utcnow()
    dead = list(session.scalars(
        update(WorkerRow).where(WorkerRow.status == "running",
                                WorkerRow.heartbeat_at < now - timedelta(seconds=silent_s))
        .values(status="dead", current_job_id=None).returning(WorkerRow.id)))
    if not dead:
        return []
    orphans = session.execute(
        select(JobRow.id, JobRow.stage, JobRow.worker_id, ScheduleRow.queue_class, JobRow.tenant)
        .join(ScheduleRow, ScheduleRow.key == JobRow.key)
        .where(JobRow.worker_id.in_(dead), JobRow.status == "running", JobRow.lease_until < now)
    ).all()
    requeued = []
    for job_id, stage, worker, queue_class, tenant in orphans:
        if session.execute(update(JobRow).where(
                JobRow.id == job_id, JobRow.worker_id == worker, JobRow.status == "running")
                .values(status="queued", worker_id=None, lease_until=None, updated_at=now,
                        needs_enqueue=True)).rowcount:
            session.add(JobEventRow(job_id=job_id, status="queued", worker_id=worker, at=now,
                                    message=f"worker {worker} sent no heartbeat for "
                                            f"{silent_s:g} s (killed or cut off); queued again"))
            requeued.append((job_id, stage, queue_class, tenant))
    return requeued
