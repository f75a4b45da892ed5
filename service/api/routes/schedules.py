"""`GET /v1/schedules/{key}`: the hot path of every client start.

Served by the ASGI fast path (service/api/fastpath.py) ahead of FastAPI, except for a
token whose grant is not kept yet, which this route checks; both answer from
service/api/lookup_answers.py, byte for byte alike. The route also describes the endpoint
in the OpenAPI document."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.api.deps import Client
from service.api.lookup_answers import KEY_RE, LookupAnswers

__all__ = ["KEY_RE", "router"]  # KEY_RE: the admin, plan and dashboard routes check keys alike

router = APIRouter(prefix="/v1", tags=["schedules"])


@router.get("/schedules/{key}", responses={200: {"description": "schedule"},
                                           202: {"description": "pending"},
                                           404: {"description": "unknown"}})
async def get_schedule(key: str, request: Request, _who: Client) -> Response:
    """200 with the schedule (`heuristic` or `tuned`), 202 while pending, 404 unknown,
    invalidated or failed (the error code says which)."""
    lookups: LookupAnswers = request.app.state.lookups
    return (await lookups.answer(key)).response()
