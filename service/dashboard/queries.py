"""The one listing the dashboard needs that `service.admin_queries` lacks: entries sorted by
tuning time. Used only while `admin_queries.SORTS` has no `tuning_s`; everything else (and
this too, once the service adds that sort) goes through `admin_queries.list_entries`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from service import admin_queries
from service.models import ScheduleRow


def list_entries(session: Session, sort: str = "last_used", **filters: Any) -> dict[str, Any]:
    """`admin_queries.list_entries`, plus `sort="tuning_s"` (same filters, same result shape)."""
    if sort != "tuning_s" or sort in admin_queries.SORTS:
        return admin_queries.list_entries(session, sort=sort, **filters)
    return _by_tuning_time(session, **filters)


def _by_tuning_time(session: Session, q: str | None = None, target: str | None = None,
                    status: str | None = None, tag: str | None = None, order: str = "desc",
                    page: int = 1, per_page: int = 50) -> dict[str, Any]:
    # The same filters as admin_queries.list_entries; callers validate the values.
    query = select(ScheduleRow)
    if q:
        prefix = q.strip().lower().replace("%", "").replace("_", "") + "%"
        query = query.where(or_(ScheduleRow.key.like(prefix), ScheduleRow.graph_hash.like(prefix)))
    if target:
        query = query.where(or_(ScheduleRow.queue_class == target, ScheduleRow.arch == target,
                                ScheduleRow.device_name == target))
    if status:
        query = query.where(ScheduleRow.status == status)
    if tag:
        query = query.where(ScheduleRow.tag == tag)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    column = ScheduleRow.tuning_s
    ordered = (column.desc() if order == "desc" else column.asc()).nulls_last()
    rows = session.scalars(query.order_by(ordered, ScheduleRow.key)
                           .offset((page - 1) * per_page).limit(per_page)).all()
    return {"items": [admin_queries.entry_item(r) for r in rows], "total": total, "page": page,
            "per_page": per_page}
