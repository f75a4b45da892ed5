"""Retention: what `kiln db prune` deletes, and only that.

Kept forever: graphs, entries (schedules and their kernels), jobs, tokens, the measurements
of each entry's latest tuning pass. Deleted when older than the policy says:

- status history (job events) of finished jobs, `events_days` after the event;
- measurements of superseded tuning passes (an entry tuned again keeps only its latest
  pass) and every measurement of an invalidated entry, `measurements_days` after they were
  taken;
- per-minute hit and miss counters, `counters_days` after their minute;
- workers stopped or dead for `workers_days`;
- dashboard sessions that have expired (at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from service.models import (
    DashboardSessionRow,
    JobEventRow,
    JobRow,
    LookupCountRow,
    MeasurementRow,
    ScheduleRow,
    WorkerRow,
    utcnow,
)


@dataclass(frozen=True)
class Policy:
    """How many days each kind of record is kept (see the module docstring)."""

    events_days: float = 30.0
    measurements_days: float = 30.0
    counters_days: float = 90.0
    workers_days: float = 7.0


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
    }
    counts: dict[str, int] = {}
    for name, (model, where) in targets.items():
        if dry_run:
            counts[name] = session.scalar(select(func.count()).select_from(model).where(where)) or 0
        else:
            counts[name] = session.execute(delete(model).where(where)
                                           .execution_options(synchronize_session=False)).rowcount
    return counts
