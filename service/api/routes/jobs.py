"""`GET /v1/jobs/{id}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path

from service import store
from service.api.deps import Client, Ctx
from service.errors import ApiError

router = APIRouter(prefix="/v1", tags=["jobs"])


@router.get("/jobs/{job_id}")
def get_job(ctx: Ctx, who: Client,
            job_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    """Status, progress, attempts, error and status history of a job. A client token sees
    only the jobs of keys it submitted (others answer 404, as if absent); admins, and the
    anonymous callers of a loopback bind, see all."""
    with ctx.transaction() as session:
        job = store.job_by_id(session, job_id)
        hidden = who.role == "client" and who.owner is not None \
            and not store.job_visible(session, job_id, who.owner)
        if job is None or hidden:
            raise ApiError(404, "not_found", f"no job {job_id}")
        return store.job_dict(session, job)
