"""Jobs: lookups, transitions (claim, renew, fail, finish, hand over) with their status
history, and the one way to put a job on the queue: `enqueue_after_commit`, whose failures
leave the job marked `needs_enqueue` for recovery. Callers own the transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.models import JobEventRow, JobRow, ScheduleRow, utcnow
from service.queue.base import BUILD_STREAM, tune_stream

AFTER_COMMIT = "kiln_enqueue_after_commit"
UNQUEUED = "kiln_unqueued"
# The error of a job whose graph had no stored wire form; a resubmission queues it again.
WIRE_PRUNED = ("the graph's stored wire form was pruned (kiln db prune --wire-days) after its "
               "entries went unused; submit the graph again (run the model with the kiln "
               "backend) and this job runs again")


def stream_name(stage: str, queue_class: str) -> str:
    """The stream a job of this stage and target class waits on."""
    return BUILD_STREAM if stage == "build" else tune_stream(queue_class)


# ---- enqueue after commit ------------------------------------------------------------------

def enqueue_after_commit(session: Session, stage: str, queue_class: str, job_id: int,
                         tenant: str, marked: bool = False) -> None:
    """Put the job on its stage's stream, in its tenant's turn, once this transaction commits
    (never before: a worker must find the row). The ServiceContext that made the session
    does it; a failed enqueue marks the job `needs_enqueue`, and `marked=True` (the job
    carries the mark) clears the mark once the enqueue succeeds."""
    session.info.setdefault(AFTER_COMMIT, []).append(
        (stream_name(stage, queue_class), job_id, tenant, marked))


def take_after_commit(session: Session) -> list[tuple[str, int, str, bool]]:
    """The enqueues registered in this session's transaction, (stream, job id, tenant,
    marked); empties the list."""
    return session.info.pop(AFTER_COMMIT, [])


def note_unqueued(session: Session, job_ids: list[int]) -> None:
    """Remember on the session which registered enqueues failed (see `unqueued`)."""
    session.info[UNQUEUED] = list(job_ids)


def unqueued(session: Session) -> list[int]:
    """The jobs whose enqueue failed when this session's transaction committed; a caller that
    answers for the enqueue (a submission) reports the outage."""
    return session.info.get(UNQUEUED, [])


def set_needs_enqueue(session: Session, job_ids: list[int], value: bool) -> None:
    """Mark queued jobs whose enqueue failed (value=True), or clear the mark of jobs now on
    the queue (value=False)."""
    where = JobRow.status == "queued" if value else JobRow.needs_enqueue
    session.execute(update(JobRow).where(JobRow.id.in_(job_ids), where)
                    .values(needs_enqueue=value))


def recoverable_jobs(session: Session, lost: bool, stale_after_s: float,
                     lease_s: float) -> list[tuple[int, str, str]]:
    """(job id, stage, queue class) of the jobs the queue may have lost: every unfinished job
    when it lost its state; else queued jobs marked `needs_enqueue` or untouched for
    `stale_after_s`, and running jobs whose lease ran out a lease ago. Queued ones are
    touched, so the stale rule does not pick them again at once."""
    now = utcnow()
    query = select(JobRow.id, JobRow.stage, ScheduleRow.queue_class, JobRow.tenant).join(
        ScheduleRow, ScheduleRow.key == JobRow.key)
    if lost:
        query = query.where(JobRow.status.in_(("queued", "running")))
    else:
        query = query.where(
            ((JobRow.status == "queued")
             & (JobRow.needs_enqueue
                | (JobRow.updated_at < now - timedelta(seconds=stale_after_s))))
            # held by a worker that died after its message was lost or settled
            | ((JobRow.status == "running")
               & (JobRow.lease_until < now - timedelta(seconds=lease_s))))
    rows = [(r.id, r.stage, r.queue_class, r.tenant) for r in session.execute(query.order_by(JobRow.id))]
    if rows:
        session.execute(update(JobRow).where(JobRow.id.in_([r[0] for r in rows]),
                                             JobRow.status == "queued").values(updated_at=now))
    return rows


def unfinished_jobs(session: Session, job_ids: list[int]) -> list[tuple[int, str, str, str]]:
    """(job id, stage, queue class, tenant) of those of these jobs that are queued or
    running, by id."""
    query = select(JobRow.id, JobRow.stage, ScheduleRow.queue_class, JobRow.tenant).join(
        ScheduleRow, ScheduleRow.key == JobRow.key).where(
        JobRow.id.in_(job_ids), JobRow.status.in_(("queued", "running")))
    return [tuple(r) for r in session.execute(query.order_by(JobRow.id))]


# ---- lookups and history -------------------------------------------------------------------

def add_event(session: Session, job: JobRow, status: str, worker: str | None, msg: str | None = None) -> None:
    """Record one transition in the job's status history."""
    session.add(JobEventRow(job_id=job.id, status=status, worker_id=worker, message=msg, at=utcnow()))


def job_by_key(session: Session, key: str) -> JobRow | None:
    """The job for a key, or None."""
    return session.scalars(select(JobRow).where(JobRow.key == key)).one_or_none()


def job_by_id(session: Session, job_id: int) -> JobRow | None:
    """The job with this id, or None."""
    return session.get(JobRow, job_id)


def requeue(session: Session, job: JobRow, stage: str, why: str) -> None:
    """Put a job back in the queue from scratch (retune, resubmission)."""
    now = utcnow()
    session.execute(update(JobRow).where(JobRow.id == job.id).values(
        status="queued", stage=stage, attempts=0, error=None, progress=0.0,
        worker_id=None, lease_until=None, updated_at=now, finished_at=None))
    add_event(session, job, "queued", None, why)


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


def _held(job: JobRow, worker: str) -> Any:
    return (JobRow.id == job.id) & (JobRow.worker_id == worker) & (JobRow.status == "running")


def finish(session: Session, job: JobRow, worker: str, message: str,
           tuned_device: str | None = None) -> bool:
    """End a job `done` if this worker still holds it; `tuned_device` is the GPU its tuning
    child reported (kept as it was when None: a build does not clear it)."""
    now = utcnow()
    values: dict[str, Any] = {"status": "done", "progress": 1.0, "finished_at": now,
                              "updated_at": now, "lease_until": None, "error": None}
    if tuned_device is not None:
        values["tuned_device"] = tuned_device
    done = session.execute(update(JobRow).where(_held(job, worker)).values(**values)).rowcount
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
    taken = session.execute(
        update(JobRow).where(JobRow.id.in_(ids), JobRow.status == "done", JobRow.stage == "build")
        .values(stage="tune", status="queued", attempts=0, progress=0.5, error=None,
                worker_id=None, lease_until=None, finished_at=None, updated_at=now)
        .returning(JobRow.id, JobRow.tenant)).all()
    for job_id, tenant in taken:
        session.add(JobEventRow(job_id=job_id, status="queued", worker_id=worker, at=now,
                                message="a GPU worker for this target started; tuning"))
        enqueue_after_commit(session, "tune", queue_class, job_id, tenant)
    return [job_id for job_id, _tenant in taken]


def job_dict(session: Session, job: JobRow) -> dict[str, Any]:
    """A job as `GET /v1/jobs/{id}` shows it."""
    events = session.scalars(select(JobEventRow).where(JobEventRow.job_id == job.id)
                             .order_by(JobEventRow.id)).all()
    return {
        "id": job.id, "key": job.key, "status": job.status, "stage": job.stage,
        "progress": job.progress, "attempts": job.attempts, "error": job.error,
        "worker": job.worker_id, "tenant": job.tenant, "tuned_device": job.tuned_device,
        "created_at": job.created_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "history": [{"status": e.status, "at": e.at.isoformat(), "worker": e.worker_id,
                     "message": e.message} for e in events],
    }
