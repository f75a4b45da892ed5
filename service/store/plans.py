"""Plans (kiln.plan/1, compiler/wire/plan.py): stored by `PUT /v1/plans/{key}` after a
client's compile, fetched by `GET /v1/plans/{key}` on the next process's.

Per tenant (service/tenants.py): a plan is stored under its key and the writer's tenant, and
a tenant's lookup reads its own tenant's plan, else the one an admin published to all
(tenant `*`). So a plan one tenant stored for a key never reaches another tenant's jobs,
whatever its graphs compute. First writer wins within a tenant: a stored plan is never
replaced (the primary key decides between two concurrent writers), only deleted by an admin.
The body is the canonical JSON text, kept and served as is. Callers own the transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

from service.db import insert_ignore
from service.models import PlanRow, utcnow
from service.tenants import ALL_TENANTS


def put_plan(session: Session, key: str, tenant: str, kind: str, body: str) -> bool:
    """Store a checked plan's canonical text under `key` for `tenant`; True when stored,
    False when the tenant already holds a plan for the key (which stays as it is)."""
    return insert_ignore(session, PlanRow.__table__, dict(
        key=key, tenant=tenant, kind=kind, body=body, bytes=len(body.encode("utf-8")),
        created_at=utcnow(), hits=0))


def has_plan(session: Session, key: str, tenant: str) -> bool:
    """Whether `tenant` holds its own plan for `key` (no hit counted)."""
    return session.get(PlanRow, (key, tenant)) is not None


def _visible(key: str, tenant: str) -> Any:
    """The one plan `tenant` reads for `key`: its own, else the published one."""
    return (select(PlanRow.tenant).where(PlanRow.key == key,
                                         PlanRow.tenant.in_((tenant, ALL_TENANTS)))
            .order_by(case((PlanRow.tenant == tenant, 0), else_=1)).limit(1)
            .scalar_subquery())


def get_plan(session: Session, key: str, tenant: str) -> str | None:
    """The stored text of the plan `tenant` reads for `key` (its own, else the published
    one), counting a hit; None when there is none."""
    # One statement picks, reads and counts: no second round trip for the counter.
    return session.execute(
        update(PlanRow.__table__)
        .where(PlanRow.key == key, PlanRow.tenant == _visible(key, tenant))
        .values(hits=PlanRow.hits + 1, last_hit_at=utcnow())
        .returning(PlanRow.body)).scalar_one_or_none()


def publish_plan(session: Session, key: str, tenant: str) -> bool | None:
    """Publish `tenant`'s plan for `key` to every tenant (a copy under tenant `*`). True when
    published, False when the key's published plan is already this very text; None when
    the tenant holds no plan for the key. ValueError when another text is published for the
    key (an admin invalidates that one first)."""
    row = session.get(PlanRow, (key, tenant))
    if row is None:
        return None
    if insert_ignore(session, PlanRow.__table__, dict(
            key=key, tenant=ALL_TENANTS, kind=row.kind, body=row.body, bytes=row.bytes,
            created_at=utcnow(), hits=0, published_from=tenant)):
        return True
    published = session.get(PlanRow, (key, ALL_TENANTS))
    if published is not None and published.body == row.body:
        return False
    raise ValueError(f"another plan is published for key {key} (from tenant "
                     f"{published.published_from if published else '?'}); invalidate it "
                     "first (tenant '*')")


def delete_plan(session: Session, key: str, tenant: str | None = None) -> int:
    """Delete `key`'s plan of `tenant` (`*`: the published one), or of every tenant when
    `tenant` is None; how many were deleted."""
    stmt = delete(PlanRow.__table__).where(PlanRow.key == key)
    if tenant is not None:
        stmt = stmt.where(PlanRow.tenant == tenant)
    return session.execute(stmt).rowcount


def list_plans(session: Session, key: str | None = None, tenant: str | None = None,
               limit: int = 100) -> list[dict[str, Any]]:
    """The stored plans (not their bodies), newest first, for the admin API."""
    stmt = select(PlanRow.key, PlanRow.tenant, PlanRow.kind, PlanRow.bytes, PlanRow.created_at,
                  PlanRow.hits, PlanRow.last_hit_at, PlanRow.published_from)
    if key is not None:
        stmt = stmt.where(PlanRow.key == key)
    if tenant is not None:
        stmt = stmt.where(PlanRow.tenant == tenant)
    rows = session.execute(stmt.order_by(PlanRow.created_at.desc()).limit(limit)).all()
    return [{**row._asdict(),
             "created_at": row.created_at.isoformat(),
             "last_hit_at": row.last_hit_at.isoformat() if row.last_hit_at else None}
            for row in rows]


def count_plans(session: Session) -> int:
    """How many plans are stored (every tenant's and the published ones)."""
    return session.scalar(select(func.count()).select_from(PlanRow)) or 0
