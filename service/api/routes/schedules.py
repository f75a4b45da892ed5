"""`GET /v1/schedules/{key}`: the hot path of every client start."""

from __future__ import annotations

import json
import re

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.api.deps import Client, Hits
from service.errors import ApiError
from service.hotpath import DatabaseUnavailable, ScheduleReader
from service.metrics import LOOKUPS

router = APIRouter(prefix="/v1", tags=["schedules"])
# \Z, not $: `$` also matches before a trailing newline, so "<64 hex>\n" would pass.
KEY_RE = re.compile(r"^[0-9a-f]{64}\Z")


@router.get("/schedules/{key}", responses={200: {"description": "schedule"},
                                           202: {"description": "pending"},
                                           404: {"description": "unknown"}})
async def get_schedule(key: str, request: Request, hits: Hits, _who: Client) -> Response:
    """200 with the schedule (`heuristic` or `tuned`), 202 while pending, 404 unknown,
    invalidated or failed (the error code says which)."""
    if not KEY_RE.match(key):
        raise ApiError(422, "invalid_key", "a key is 64 lowercase hex digits")
    reader: ScheduleReader = request.app.state.reader
    try:
        row = await reader.lookup(key)
    except DatabaseUnavailable as exc:
        raise ApiError(503, "database_unavailable", "the database is unavailable; retry shortly",
                       {"Retry-After": "2"}) from exc
    if row is None:
        raise ApiError(404, "not_found", f"no schedule for key {key}; submit the graph")
    if row.status in ("heuristic", "tuned") and row.schedule:
        hits.add(key)
        LOOKUPS.labels("hit").inc()
        # The stored JSON is spliced in as is: no parse and re-encode on the hot path. The
        # job's state tells a client whether a better schedule is coming (`job_status`).
        body = (f'{{"key":"{key}","status":"{row.status}",'
                f'"job_status":{json.dumps(row.job_status)},'
                f'"schedule":{row.schedule}}}')
        return Response(body, media_type="application/json")
    if row.status == "invalidated":
        raise ApiError(404, "invalidated", f"the schedule for {key} was invalidated; submit again")
    if row.status == "failed":
        raise ApiError(404, "failed", f"building a schedule for {key} failed: {row.error}")
    return JSONResponse({"key": key, "status": "pending", "job_id": row.job_id,
                         "job_status": row.job_status}, status_code=202)
