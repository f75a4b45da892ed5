"""Plans (kiln.plan/1, compiler/wire/plan.py): stored by `PUT /v1/plans/{key}` after a
client's compile, fetched by `GET /v1/plans/{key}` on the next process's.

First writer wins: a key's plan is never replaced (the primary key decides between two
concurrent writers), only deleted by an admin. The body is the canonical JSON text, kept
and served as is. Callers own the transaction.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from service.db import insert_ignore
from service.models import PlanRow, utcnow


def put_plan(session: Session, key: str, kind: str, body: str) -> bool:
    """Store a checked plan's canonical text under `key`; True when stored, False when the
    key already holds a plan (which stays as it is)."""
    return insert_ignore(session, PlanRow.__table__, dict(
        key=key, kind=kind, body=body, bytes=len(body.encode("utf-8")), created_at=utcnow(),
        hits=0))


def has_plan(session: Session, key: str) -> bool:
    """Whether `key` holds a plan (no hit counted)."""
    return session.scalar(select(PlanRow.key).where(PlanRow.key == key)) is not None


def get_plan(session: Session, key: str) -> str | None:
    """The stored text of `key`'s plan, counting a hit; None when there is none."""
    # One statement reads and counts: no second round trip for the counter.
    return session.execute(
        update(PlanRow.__table__).where(PlanRow.key == key)
        .values(hits=PlanRow.hits + 1, last_hit_at=utcnow())
        .returning(PlanRow.body)).scalar_one_or_none()


def delete_plan(session: Session, key: str) -> bool:
    """Delete `key`'s plan; False when there was none."""
    return session.execute(delete(PlanRow.__table__).where(PlanRow.key == key)).rowcount > 0


def count_plans(session: Session) -> int:
    """How many plans are stored."""
    return session.scalar(select(func.count()).select_from(PlanRow)) or 0
