"""Retention: what `kiln db prune` deletes, and only that.

Kept forever: graphs, entries (schedules and their kernels), jobs, tokens, the measurements
of each entry's latest tuning pass, plans (an admin deletes one: service/store/plans.py).
Deleted when older than the policy says:

- status history (job events) of finished jobs, `events_days` after the event;
- measurements of superseded tuning passes (an entry tuned again keeps only its latest
  pass) and every measurement of an invalidated entry, `measurements_days` after they were
  taken;
- per-minute hit and miss counters, `counters_days` after their minute;
- workers stopped or dead for `workers_days`;
- dashboard sessions that have expired (at once);
- compiled kernel binaries (service/store/binaries.py) stored over BINARIES_GRACE_DAYS (1) ago whose
  kernel source no entry's schedule uses any more (every entry that had it was invalidated,
  or re-tuned to other kernels); a later build stores them again;
- only when `wire_days` is given: the stored wire form (the body, up to the wire size limit)
  of graphs whose every entry went unused (no hit, no change) for `wire_days` and has no job
  in flight. The graph row, its entries and their schedules stay and keep serving; a job that
  needs the body (a re-tune) fails asking for the graph again, and a resubmission of the
  graph stores the body again and reruns such jobs (service/store/entries.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.orm import Session

from service.models import (
    DashboardSessionRow,
    GraphRow,
    JobEventRow,
    JobRow,
    KernelBinaryFileRow,
    KernelBinaryRow,
    KernelRow,
    LookupCountRow,
    MeasurementRow,
    ScheduleRow,
    WorkerRow,
    utcnow,
)

BINARIES_GRACE_DAYS = 1.0  # a binary is stored with its schedule; a day covers any race


@dataclass(frozen=True)
class Policy:
    """How many days each kind of record is kept (see the module docstring)."""

    events_days: float = 30.0
    measurements_days: float = 30.0
    counters_days: float = 90.0
    workers_days: float = 7.0
    wire_days: float | None = None  # None: graph bodies are kept


def prune(session: Session, policy: Policy = Policy(), dry_run: bool = False) -> dict[str, int]:
    """Delete what `policy` lets go; returns the rows deleted (or, with `dry_run`, that
    would be) per kind. The caller owns the transaction."""
    now = utcnow()

    def before(days: float) -> object:
        return now - timedelta(days=days)

    latest_pass = (select(MeasurementRow.schedule_key, func.max(MeasurementRow.at).label("at"))
                   .group_by(MeasurementRow.schedule_key).subquery())
    superseded = select(MeasurementRow.id).join(
        latest_pass, latest_pass.c.schedule_key == MeasurementRow.schedule_key
    ).where(MeasurementRow.at < latest_pass.c.at)
    invalidated = select(MeasurementRow.id).join(
        ScheduleRow, ScheduleRow.key == MeasurementRow.schedule_key
    ).where(ScheduleRow.status == "invalidated")
    finished_jobs = select(JobRow.id).where(JobRow.status.in_(("done", "failed")))
    used_sources = select(KernelRow.source_hash).join(
        ScheduleRow, ScheduleRow.key == KernelRow.schedule_key
    ).where(ScheduleRow.status != "invalidated", KernelRow.source_hash.is_not(None))
    stale_binaries = select(KernelBinaryRow.key).where(
        KernelBinaryRow.created_at < before(BINARIES_GRACE_DAYS),
        KernelBinaryRow.source_hash.not_in(used_sources))
    targets = {
        "job_events": (JobEventRow, (JobEventRow.at < before(policy.events_days))
                       & JobEventRow.job_id.in_(finished_jobs)),
        "measurements": (MeasurementRow, (MeasurementRow.at < before(policy.measurements_days))
                         & (MeasurementRow.id.in_(superseded)
                            | MeasurementRow.id.in_(invalidated))),
        "lookup_counts": (LookupCountRow, LookupCountRow.bucket < before(policy.counters_days)),
        "workers": (WorkerRow, WorkerRow.status.in_(("stopped", "dead"))
                    & (WorkerRow.heartbeat_at < before(policy.workers_days))),
        "dashboard_sessions": (DashboardSessionRow, DashboardSessionRow.expires_at <= now),
        # files first: SQLite enforces no foreign-key cascade unless asked
        "kernel_binary_files": (KernelBinaryFileRow, KernelBinaryFileRow.key.in_(stale_binaries)),
        "kernel_binaries": (KernelBinaryRow, KernelBinaryRow.key.in_(stale_binaries)),
    }
    counts: dict[str, int] = {}
    for name, (model, where) in targets.items():
        if dry_run:
            counts[name] = session.scalar(select(func.count()).select_from(model).where(where)) or 0
        else:
            counts[name] = session.execute(delete(model).where(where)
                                           .execution_options(synchronize_session=False)).rowcount
    if policy.wire_days is not None:
        counts["graph_bodies"] = _drop_unused_wire(session, before(policy.wire_days), dry_run)
    return counts


def _drop_unused_wire(session: Session, cutoff: object, dry_run: bool) -> int:
    """Set graphs.wire to NULL where no entry of the graph was used or changed since
    `cutoff` and none has a job queued or running; the count of graphs (to be) emptied."""
    of_graph = ScheduleRow.graph_hash == GraphRow.graph_hash
    recent = exists().where(of_graph, (ScheduleRow.updated_at >= cutoff)
                            | (ScheduleRow.last_used_at >= cutoff))
    in_flight = exists().where(of_graph, JobRow.key == ScheduleRow.key,
                               JobRow.status.in_(("queued", "running")))
    where = GraphRow.wire.is_not(None) & (GraphRow.created_at < cutoff) & ~recent & ~in_flight
    if dry_run:
        return session.scalar(select(func.count()).select_from(GraphRow).where(where)) or 0
    return session.execute(update(GraphRow).where(where).values(wire=None)
                           .execution_options(synchronize_session=False)).rowcount
