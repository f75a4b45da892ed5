"""The schedule read that every client start makes (`GET /v1/schedules/{key}`), in two forms
that issue the same SQL: one prepared statement on a raw psycopg async connection
(PostgreSQL: no ORM, no transaction, no thread hop; service.hotpath owns the pool), and
SQLAlchemy Core on an engine connection (SQLite, the embedded default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select

from service.models import JobRow, ScheduleRow

_SQL = ("SELECT s.status, s.schedule, j.id, j.error, j.status FROM schedules s "
        "LEFT JOIN jobs j ON j.key = s.key WHERE s.key = %s")


@dataclass(frozen=True)
class Lookup:
    """What the database holds for a key."""

    status: str
    schedule: str | None
    job_id: int | None
    error: str | None
    job_status: str | None  # the entry's job's state: "done" says no better schedule is coming


async def lookup_pg(conn: Any, key: str) -> Lookup | None:
    """The entry of `key` read on a psycopg AsyncConnection (prepared), or None. Driver
    errors propagate: the caller decides about the connection."""
    cur = await conn.execute(_SQL, (key,), prepare=True)
    row = await cur.fetchone()
    return Lookup(*row) if row else None


def lookup_sync(engine: Engine, key: str) -> Lookup | None:
    """The entry of `key` read on a connection of `engine` (no ORM session), or None."""
    with engine.connect() as conn:
        row = conn.execute(
            select(ScheduleRow.status, ScheduleRow.schedule, JobRow.id, JobRow.error, JobRow.status)
            .outerjoin(JobRow, JobRow.key == ScheduleRow.key).where(ScheduleRow.key == key)
        ).one_or_none()
    return Lookup(*row) if row else None


def ping(engine: Engine) -> None:
    """Run a trivial statement: raises when the database does not answer."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
