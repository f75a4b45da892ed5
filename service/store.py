"""The service's queries: submissions, lookups, job transitions. Callers own the transaction."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db import insert_ignore, upsert_add
from service.models import (
    GraphRow,
    JobEventRow,
    JobOwnerRow,
    JobRow,
    KernelRow,
    LookupCountRow,
    MeasurementRow,
    ScheduleRow,
    WorkerRow,
    utcnow,
)
from service.queue.base import BUILD_STREAM, tune_stream

READY = ("heuristic", "tuned")
MISS_REASONS = ("unknown_graph", "other_gpu", "other_versions", "other_compiler")
AFTER_COMMIT = "kiln_enqueue_after_commit"
# The error of a job whose graph had no stored wire form; a resubmission queues it again.
WIRE_PRUNED = ("the graph's stored wire form was pruned (kiln db prune --wire-days) after its "
               "entries went unused; submit the graph again (run the model with the kiln "
               "backend) and this job runs again")


def stream_name(stage: str, queue_class: str) -> str:
    """The stream a job of this stage and target class waits on."""
    return BUILD_STREAM if stage == "build" else tune_stream(queue_class)


def enqueue_after_commit(session: Session, stage: str, queue_class: str, job_id: int) -> None:
    """Ask the ServiceContext that made this session to enqueue the job once the transaction
    commits (never before: a worker must find the row)."""
    session.info.setdefault(AFTER_COMMIT, []).append((stream_name(stage, queue_class), job_id))


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


def add_event(session: Session, job: JobRow, status: str, worker: str | None, msg: str | None = None) -> None:
    """Record one transition in the job's status history."""
    session.add(JobEventRow(job_id=job.id, status=status, worker_id=worker, message=msg, at=utcnow()))


def schedule_by_key(session: Session, key: str) -> ScheduleRow | None:
    """The entry for a key, or None."""
    return session.scalars(select(ScheduleRow).where(ScheduleRow.key == key)).one_or_none()


def job_by_key(session: Session, key: str) -> JobRow | None:
    """The job for a key, or None."""
    return session.scalars(select(JobRow).where(JobRow.key == key)).one_or_none()


def submit(session: Session, sub: Submission) -> tuple[ScheduleRow, JobRow, bool]:
    """Record a submission; returns (entry, job, enqueue). Exactly one concurrent caller per
    key gets enqueue=True: the unique constraints on graphs, schedules and jobs decide."""
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
        key=sub.key, stage="build", status="queued", progress=0.0, attempts=0,
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
        enqueue_after_commit(session, job.stage, queue_class, job.id)


def add_job_owner(session: Session, job_id: int, owner: str) -> None:
    """Record that `owner` (a token's hash) submitted this job's key."""
    insert_ignore(session, JobOwnerRow.__table__, {"job_id": job_id, "owner": owner})


def job_visible(session: Session, job_id: int, owner: str) -> bool:
    """Whether `owner` submitted this job's key (and so may read the job)."""
    return session.get(JobOwnerRow, (job_id, owner)) is not None


def requeue(session: Session, job: JobRow, stage: str, why: str) -> None:
    """Put a job back in the queue from scratch (retune, resubmission)."""
    now = utcnow()
    session.execute(update(JobRow).where(JobRow.id == job.id).values(
        status="queued", stage=stage, attempts=0, error=None, progress=0.0,
        worker_id=None, lease_until=None, updated_at=now, finished_at=None))
    add_event(session, job, "queued", None, why)


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


# ---- job transitions (workers) -------------------------------------------------------------

def claim(session: Session, job_id: int, stage: str, worker: str, lease_s: float,
          max_attempts: int) -> JobRow | None:
    """Take a job for `worker` if it is queued, or running on an expired lease.
    Returns None when someone else holds it, it is finished, or it has used up its attempts
    (it then ends `failed`, keeping the last error)."""
    now = utcnow()
    taken = session.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.stage == stage,
               (JobRow.status == "queued")
               | ((JobRow.status == "running") & (JobRow.lease_until < now)))
        .values(status="running", worker_id=worker, attempts=JobRow.attempts + 1,
                lease_until=now + timedelta(seconds=lease_s), updated_at=now, started_at=now)
    ).rowcount
    if not taken:
        return None
    job = session.get(JobRow, job_id, populate_existing=True)
    assert job is not None
    if job.attempts > max_attempts:
        last = job.error or "the worker holding it died"
        finish_failed(session, job, worker, f"gave up after {max_attempts} attempts: {last}")
        return None
    add_event(session, job, "running", worker, f"attempt {job.attempts}")
    return job


def renew(session: Session, job_id: int, worker: str, lease_s: float,
          progress: float | None = None) -> bool:
    """Extend the lease of a job this worker holds; False when it lost it."""
    now = utcnow()
    values: dict[str, Any] = {"lease_until": now + timedelta(seconds=lease_s), "updated_at": now}
    if progress is not None:
        values["progress"] = progress
    return bool(session.execute(update(JobRow).where(
        JobRow.id == job_id, JobRow.worker_id == worker, JobRow.status == "running"
    ).values(**values)).rowcount)


def note_timeout(session: Session, job: JobRow, worker: str, limit_s: float) -> None:
    """Record, once, that the attempt in hand ran past its time limit; its lease is left to
    run out so another worker takes the job (the attempt counts)."""
    error = f"attempt {job.attempts} ran past the time limit of {limit_s:g} s"
    if session.execute(update(JobRow).where(_held(job, worker), JobRow.error.is_distinct_from(error))
                       .values(error=error)).rowcount:
        add_event(session, job, "running", worker, error)


def finish_failed(session: Session, job: JobRow, worker: str | None, error: str) -> None:
    """End a job `failed` with its error, and mark its entry failed unless it has a schedule."""
    now = utcnow()
    session.execute(update(JobRow).where(JobRow.id == job.id).values(
        status="failed", error=error, finished_at=now, updated_at=now, lease_until=None))
    session.execute(update(ScheduleRow).where(
        ScheduleRow.key == job.key, ScheduleRow.status == "pending").values(status="failed", updated_at=now))
    add_event(session, job, "failed", worker, error)


def fail_attempt(session: Session, job: JobRow, worker: str, error: str, max_attempts: int) -> str:
    """Record a failed attempt: back to `queued`, or `failed` once attempts are used up
    ('lost' when another worker took the job meanwhile)."""
    if job.attempts >= max_attempts:
        times = "once" if job.attempts == 1 else f"{job.attempts} times"
        finish_failed(session, job, worker, f"failed {times}; last error: {error}")
        return "failed"
    now = utcnow()
    if not session.execute(update(JobRow).where(_held(job, worker)).values(
            status="queued", error=error, worker_id=None, lease_until=None,
            updated_at=now)).rowcount:
        return "lost"
    add_event(session, job, "queued", worker, f"attempt {job.attempts} failed: {error}")
    return "queued"


def release(session: Session, job: JobRow, worker: str, why: str) -> None:
    """Give a job back without counting the attempt (graceful shutdown)."""
    now = utcnow()
    if session.execute(update(JobRow).where(_held(job, worker)).values(
            status="queued", attempts=JobRow.attempts - 1, worker_id=None, lease_until=None,
            updated_at=now)).rowcount:
        add_event(session, job, "queued", worker, why)


def bury_dead_workers(session: Session, silent_s: float) -> list[tuple[int, str, str]]:
    """Mark `dead` every running worker whose last heartbeat is older than `silent_s`, and
    put back in the queue the jobs they held whose lease has run out (the attempt counts, so
    a job that kills its workers still ends failed). Returns (job id, stage, queue class) of
    the jobs to enqueue once this commits; they stay marked `needs_enqueue` until then."""
    now = utcnow()
    dead = list(session.scalars(
        update(WorkerRow).where(WorkerRow.status == "running",
                                WorkerRow.heartbeat_at < now - timedelta(seconds=silent_s))
        .values(status="dead", current_job_id=None).returning(WorkerRow.id)))
    if not dead:
        return []
    orphans = session.execute(
        select(JobRow.id, JobRow.stage, JobRow.worker_id, ScheduleRow.queue_class)
        .join(ScheduleRow, ScheduleRow.key == JobRow.key)
        .where(JobRow.worker_id.in_(dead), JobRow.status == "running", JobRow.lease_until < now)
    ).all()
    requeued = []
    for job_id, stage, worker, queue_class in orphans:
        if session.execute(update(JobRow).where(
                JobRow.id == job_id, JobRow.worker_id == worker, JobRow.status == "running")
                .values(status="queued", worker_id=None, lease_until=None, updated_at=now,
                        needs_enqueue=True)).rowcount:
            session.add(JobEventRow(job_id=job_id, status="queued", worker_id=worker, at=now,
                                    message=f"worker {worker} sent no heartbeat for "
                                            f"{silent_s:g} s (killed or cut off); queued again"))
            requeued.append((job_id, stage, queue_class))
    return requeued


def _held(job: JobRow, worker: str) -> Any:
    return (JobRow.id == job.id) & (JobRow.worker_id == worker) & (JobRow.status == "running")


def finish(session: Session, job: JobRow, worker: str, message: str) -> bool:
    """End a job `done` if this worker still holds it."""
    now = utcnow()
    done = session.execute(update(JobRow).where(_held(job, worker)).values(
        status="done", progress=1.0, finished_at=now, updated_at=now, lease_until=None,
        error=None)).rowcount
    if done:
        add_event(session, job, "done", worker, message)
    return bool(done)


def hand_to_tuner(session: Session, job: JobRow, worker: str) -> bool:
    """After the heuristic build, leave the job queued for a GPU worker's tuning stage."""
    now = utcnow()
    moved = session.execute(update(JobRow).where(_held(job, worker)).values(
        stage="tune", status="queued", attempts=0, progress=0.5, worker_id=None,
        lease_until=None, error=None, updated_at=now)).rowcount
    if moved:
        add_event(session, job, "queued", worker, "heuristic schedule published; waiting for tuning")
    return bool(moved)


def adopt_untuned(session: Session, queue_class: str, worker: str) -> list[int]:
    """A GPU worker starting for `queue_class` takes over the entries that were built while no
    GPU served it: their jobs go back to the queue at the tuning stage (enqueued at commit)."""
    ids = list(session.scalars(
        select(JobRow.id).join(ScheduleRow, ScheduleRow.key == JobRow.key).where(
            ScheduleRow.queue_class == queue_class, ScheduleRow.status == "heuristic",
            JobRow.status == "done", JobRow.stage == "build")))
    if not ids:
        return []
    now = utcnow()
    taken = list(session.scalars(
        update(JobRow).where(JobRow.id.in_(ids), JobRow.status == "done", JobRow.stage == "build")
        .values(stage="tune", status="queued", attempts=0, progress=0.5, error=None,
                worker_id=None, lease_until=None, finished_at=None, updated_at=now)
        .returning(JobRow.id)))
    for job_id in taken:
        session.add(JobEventRow(job_id=job_id, status="queued", worker_id=worker, at=now,
                                message="a GPU worker for this target started; tuning"))
        enqueue_after_commit(session, "tune", queue_class, job_id)
    return taken


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


def job_dict(session: Session, job: JobRow) -> dict[str, Any]:
    """A job as `GET /v1/jobs/{id}` shows it."""
    events = session.scalars(select(JobEventRow).where(JobEventRow.job_id == job.id)
                             .order_by(JobEventRow.id)).all()
    return {
        "id": job.id, "key": job.key, "status": job.status, "stage": job.stage,
        "progress": job.progress, "attempts": job.attempts, "error": job.error,
        "worker": job.worker_id,
        "created_at": job.created_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "history": [{"status": e.status, "at": e.at.isoformat(), "worker": e.worker_id,
                     "message": e.message} for e in events],
    }
