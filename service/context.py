"""What the API and the workers share at run time: settings, database, queue."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import event
from sqlalchemy.orm import Session

from service import store
from service.db import make_engine, make_sessionmaker, transaction
from service.models import utcnow
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
        # The one place jobs go on the queue (store.enqueue_after_commit registered them):
        # only once their rows are visible. A failed enqueue marks the job needs_enqueue, so a
        # resubmission or the next recovery pass enqueues it; a success clears a mark.
        failed, cleared, newly_failed = [], [], []
        for stream, job_id, tenant, marked in store.take_after_commit(session):
            try:
                self.queue.enqueue(stream, job_id, tenant)
            except QueueUnavailable as exc:
                log.warning("could not enqueue job %s (%s); recovery will retry", job_id, exc)
                failed.append(job_id)
                if not marked:
                    newly_failed.append(job_id)
                continue
            if marked:
                cleared.append(job_id)
        store.note_unqueued(session, failed)
        if newly_failed:
            self._set_marks(newly_failed, True)
        if cleared:
            self._set_marks(cleared, False)

    def _set_marks(self, job_ids: list[int], value: bool) -> None:
        try:
            with self.transaction() as session:
                store.set_needs_enqueue(session, job_ids, value)
        except Exception as exc:  # the database is down too: the stale-job rule remains
            log.warning("could not %s the re-enqueue mark of jobs %s: %s",
                        "set" if value else "clear", job_ids, exc)

    def _drop_uncommitted(self, session: Session) -> None:
        store.take_after_commit(session)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work on the database; jobs registered with
        store.enqueue_after_commit go on the queue when it commits."""
        with transaction(self.sessions) as session:
            yield session

    def recover(self, stale_after_s: float | None = None) -> int:
        """Enqueue again what the queue may have lost: every unfinished job when the queue
        came back empty (Redis restart); queued jobs whose enqueue failed, or untouched for
        too long (an enqueue lost some other way); running jobs whose lease ran out long ago
        (their worker died and no message is left to reclaim). Workers silent for a lease
        are marked dead and their jobs queued again. Duplicates are harmless; what fails to
        enqueue stays marked for the next pass. Returns the count of jobs enqueued."""
        stale_after_s = stale_after_s if stale_after_s is not None else 5 * self.settings.lease_s
        silent_s = max(self.settings.lease_s, 3 * self.settings.heartbeat_s)
        self._adopt_legacy()
        lost = self.queue.lost_state()
        with self.transaction() as session:
            todo = {job_id: rest for job_id, *rest in store.bury_dead_workers(session, silent_s)}
            todo.update({job_id: rest for job_id, *rest in store.recoverable_jobs(
                session, lost, stale_after_s, self.settings.lease_s)})
            for job_id, (stage, queue_class, tenant) in sorted(todo.items()):
                # marked=True: a mark a job may carry is cleared once it is on the queue
                store.enqueue_after_commit(session, stage, queue_class, job_id, tenant,
                                           marked=True)
        enqueued = len(todo) - len(store.unqueued(session))
        if enqueued:
            log.info("re-enqueued %d job(s)%s", enqueued, " after the queue lost its state" if lost else "")
        return enqueued

    def _adopt_legacy(self) -> None:
        """Move the messages a kiln before fair queueing left in its one stream per queue
        into their tenants' lines (upgrading a running deployment): the jobs still queued or
        running go on the queue again, then the old messages are deleted. A crash in between
        leaves duplicates, which are harmless, never a loss."""
        legacy = self.queue.legacy()
        if not legacy:
            return
        with self.transaction() as session:
            for job_id, stage, queue_class, tenant in store.unfinished_jobs(
                    session, [job for messages in legacy.values() for _mid, job in messages]):
                store.enqueue_after_commit(session, stage, queue_class, job_id, tenant,
                                           marked=True)
        for stream, messages in sorted(legacy.items()):
            self.queue.drop_legacy(stream, [mid for mid, _job in messages])
            log.info("moved %d message(s) of %s into tenants' lines", len(messages), stream)

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
