"""What the API and the workers share at run time: settings, database, queue."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from sqlalchemy import event, select, update
from sqlalchemy.orm import Session

from service import store
from service.db import make_engine, make_sessionmaker, transaction
from service.models import JobRow, ScheduleRow, WorkerRow, utcnow
from service.queue import JobQueue, QueueUnavailable, make_queue
from service.settings import Settings

log = logging.getLogger(__name__)


class ServiceContext:
    """Engine, session factory and queue built from one Settings."""

    def __init__(self, settings: Settings, queue: JobQueue | None = None) -> None:
        self.settings = settings
        self.engine = make_engine(settings.database_url, settings.db_pool_size)
        self.sessions = make_sessionmaker(self.engine)
        self.queue = queue or make_queue(settings.redis_url, settings.redis_prefix, settings.lease_s)
        event.listen(self.sessions, "after_commit", self._enqueue_committed)
        event.listen(self.sessions, "after_rollback", self._drop_uncommitted)

    def _enqueue_committed(self, session: Session) -> None:
        # Jobs queued inside a transaction (store.enqueue_after_commit) go on the queue only
        # once their rows are visible; an outage here is repaired by recover().
        failed = []
        for stream, job_id in session.info.pop(store.AFTER_COMMIT, []):
            try:
                self.queue.enqueue(stream, job_id)
            except QueueUnavailable as exc:
                log.warning("could not enqueue job %s (%s); recovery will retry", job_id, exc)
                failed.append(job_id)
        if failed:
            self._mark_unqueued(failed)

    def _mark_unqueued(self, job_ids: list[int]) -> None:
        """Remember jobs whose enqueue failed, so a resubmission or the next recovery pass
        enqueues them (without this mark only the stale-job rule would, minutes later)."""
        try:
            with self.transaction() as session:
                session.execute(update(JobRow).where(JobRow.id.in_(job_ids),
                                                     JobRow.status == "queued")
                                .values(needs_enqueue=True))
        except Exception as exc:  # the database is down too: the stale-job rule remains
            log.warning("could not mark jobs %s for re-enqueue: %s", job_ids, exc)

    def _mark_queued(self, job_ids: list[int]) -> None:
        with self.transaction() as session:
            session.execute(update(JobRow).where(JobRow.id.in_(job_ids), JobRow.needs_enqueue)
                            .values(needs_enqueue=False))

    def _drop_uncommitted(self, session: Session) -> None:
        session.info.pop(store.AFTER_COMMIT, None)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work on the database."""
        with transaction(self.sessions) as session:
            yield session

    def enqueue_job(self, job_id: int) -> None:
        """Put a job id on the stream of its current stage (after its row is committed).
        When the queue is down the job is marked for re-enqueue and QueueUnavailable raised."""
        with self.transaction() as session:
            row = session.execute(
                select(JobRow.stage, JobRow.needs_enqueue, ScheduleRow.queue_class)
                .join(ScheduleRow, ScheduleRow.key == JobRow.key).where(JobRow.id == job_id)
            ).one()
        try:
            self.queue.enqueue(store.stream_name(row.stage, row.queue_class), job_id)
        except QueueUnavailable:
            self._mark_unqueued([job_id])
            raise
        if row.needs_enqueue:
            self._mark_queued([job_id])

    def recover(self, stale_after_s: float | None = None) -> int:
        """Enqueue again what the queue may have lost: every unfinished job when the queue
        came back empty (Redis restart); queued jobs whose enqueue failed, or untouched for
        too long (an enqueue lost some other way); running jobs whose lease ran out long ago
        (their worker died and no message is left to reclaim). Workers silent for a lease
        are marked dead and their jobs queued again. Duplicates are harmless. Returns the
        count of jobs enqueued."""
        stale_after_s = stale_after_s if stale_after_s is not None else 5 * self.settings.lease_s
        silent_s = max(self.settings.lease_s, 3 * self.settings.heartbeat_s)
        lost = self.queue.lost_state()
        now = utcnow()
        with self.transaction() as session:
            orphans = store.bury_dead_workers(session, silent_s)
            query = select(JobRow.id, JobRow.stage, ScheduleRow.queue_class).join(
                ScheduleRow, ScheduleRow.key == JobRow.key)
            if lost:
                query = query.where(JobRow.status.in_(("queued", "running")))
            else:
                lease = timedelta(seconds=self.settings.lease_s)
                query = query.where(
                    ((JobRow.status == "queued")
                     & (JobRow.needs_enqueue
                        | (JobRow.updated_at < now - timedelta(seconds=stale_after_s))))
                    # held by a worker that died after its message was lost or settled
                    | ((JobRow.status == "running") & (JobRow.lease_until < now - lease)))
            rows = session.execute(query.order_by(JobRow.id)).all()
            if rows:
                session.execute(update(JobRow).where(JobRow.id.in_([r.id for r in rows]),
                                                     JobRow.status == "queued")
                                .values(updated_at=now))
        todo = {r.id: (r.stage, r.queue_class) for r in rows}
        todo.update({job_id: (stage, qc) for job_id, stage, qc in orphans})
        for job_id, (stage, queue_class) in sorted(todo.items()):
            self.queue.enqueue(store.stream_name(stage, queue_class), job_id)
        if todo:
            self._mark_queued(sorted(todo))
            log.info("re-enqueued %d job(s)%s", len(todo), " after the queue lost its state" if lost else "")
        return len(todo)

    def gpu_serves(self, session: Session, queue_class: str) -> bool:
        """Whether a live GPU worker serves this target class (recent heartbeat)."""
        window = max(3 * self.settings.heartbeat_s, 15.0)
        since = utcnow() - timedelta(seconds=window)
        return session.scalars(select(WorkerRow.id).where(
            WorkerRow.queue_class == queue_class, WorkerRow.device != "cpu",
            WorkerRow.status == "running", WorkerRow.heartbeat_at > since).limit(1)).first() is not None

    def close(self) -> None:
        """Release connections."""
        self.queue.close()
        self.engine.dispose()


class HitBuffer:
    """Per-key hit counts gathered on the hot path and flushed in one transaction a second,
    so a cache hit costs one indexed read and no write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[str, int] = {}
        self._last: dict[str, datetime] = {}
        self._minutes: dict[datetime, int] = {}

    def add(self, key: str) -> None:
        """Count one hit on `key`."""
        now = utcnow()
        with self._lock:
            self._hits[key] = self._hits.get(key, 0) + 1
            self._last[key] = now
            bucket = store.minute(now)
            self._minutes[bucket] = self._minutes.get(bucket, 0) + 1

    def flush(self, ctx: ServiceContext) -> None:
        """Write buffered counts; on failure they are kept for the next flush."""
        with self._lock:
            hits, last, minutes = self._hits, self._last, self._minutes
            self._hits, self._last, self._minutes = {}, {}, {}
        if not hits:
            return
        try:
            with ctx.transaction() as session:
                store.record_hits(session, hits, last)
                for bucket, n in minutes.items():
                    store.count_lookup(session, "hit", n, at=bucket)
        except Exception:
            log.warning("could not flush hit counters; keeping them", exc_info=True)
            with self._lock:
                for k, n in hits.items():
                    self._hits[k] = self._hits.get(k, 0) + n
                    self._last.setdefault(k, last[k])
                for b, n in minutes.items():
                    self._minutes[b] = self._minutes.get(b, 0) + n
