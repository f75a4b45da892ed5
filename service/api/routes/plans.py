"""`PUT /v1/plans/{key}` and `GET /v1/plans/{key}`: plans (kiln.plan/1) that let a
client's next process skip AOTAutograd for a dynamo graph it compiled before.

Plans are client-written code that another client's job would run, so they are scoped to
the caller's tenant (service/tenants.py): a plan is stored once per key and tenant, first
writer wins, never replaced (an admin may delete it), and a lookup answers the caller's
tenant's plan, else the one an admin published to all; never another tenant's. The service
checks each plan as data (`compiler.wire.plan.parse_plan`) and never runs it; a client
checks a fetched plan against its own dynamo graph before using it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from service import store
from service.api.deps import Client, Ctx
from service.api.routes.schedules import KEY_RE
from service.context import ServiceContext
from service.errors import ApiError
from service.intake import body_weight, intake_child, limiter_of, read_body
from service.metrics import PLAN_LOOKUPS, PLAN_STORES

router = APIRouter(prefix="/v1", tags=["plans"])

_GRAPH = {"type": "object", "description": "a kiln.graph/1 document"}
_PLAN_SCHEMA = {
    "type": "object", "description": "a kiln.plan/1 document (compiler/wire/plan.py)",
    "required": ["format", "key", "kind", "inputs", "mutated_inputs", "outputs", "forward"],
    "additionalProperties": False,
    "properties": {
        "format": {"type": "string", "enum": ["kiln.plan/1"]},
        "key": {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "the URL's key"},
        "kind": {"type": "string", "enum": ["training", "inference"]},
        "inputs": {"type": "integer", "minimum": 0},
        "mutated_inputs": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "outputs": {"type": "array", "items": {
            "type": "object", "required": ["requires_grad"], "additionalProperties": False,
            "properties": {"requires_grad": {"type": "boolean"}}}},
        "forward": _GRAPH,
        "backward": {"anyOf": [_GRAPH, {"type": "null"}],
                     "description": "a training plan's backward graph; null for inference"},
    },
}
_BODY_SCHEMA = {"required": True, "content": {"application/json": {"schema": _PLAN_SCHEMA}}}


def _check_key(key: str) -> None:
    if not KEY_RE.match(key):
        raise ApiError(422, "invalid_key", "a plan key is 64 lowercase hex digits")


def _store(ctx: ServiceContext, key: str, tenant: str, kind: str, text: str) -> bool:
    with ctx.transaction() as session:
        return store.put_plan(session, key, tenant, kind, text)


def _held(ctx: ServiceContext, key: str, tenant: str) -> bool:
    with ctx.transaction() as session:
        return store.has_plan(session, key, tenant)


def _fetch(ctx: ServiceContext, key: str, tenant: str) -> str | None:
    with ctx.transaction() as session:
        return store.get_plan(session, key, tenant)


@router.put("/plans/{key}", status_code=201, openapi_extra={"requestBody": _BODY_SCHEMA},
            responses={200: {"description": "the caller's tenant already holds a plan for the "
                                    "key, which stays"},
                       201: {"description": "stored"}, 413: {"description": "too large"},
                       422: {"description": "bad plan, or its key is not the URL's"}})
async def put_plan(key: str, request: Request, ctx: Ctx, who: Client) -> JSONResponse:
    """Store a kiln.plan/1 document under `key` (its own `key` field) for the caller's
    tenant: 201 `{"key", "created": true}`, or 200 `{"key", "created": false}` when the
    tenant already holds a plan for the key, which is kept (first writer wins; the body is
    then not checked). Another tenant's plan for the key neither blocks nor sees this one."""
    from compiler.wire.plan import max_plan_bytes

    _check_key(key)
    limit = max_plan_bytes()
    async with limiter_of(request).admit(body_weight(request, limit)):
        body = await read_body(request, limit)
        if await run_in_threadpool(_held, ctx, key, who.tenant):
            # The stored plan stays whatever this body holds: not validated for nothing
            # (every rank of a job that found none sends the same plan at once).
            PLAN_STORES.labels("known").inc()
            return JSONResponse({"key": key, "created": False}, status_code=200)
        async with intake_child(request) as child:  # checked as data, off this process
            plan = await child.plan(body)
        plan_key, kind, text = plan["key"], plan["kind"], plan["text"]
    if plan_key != key:
        raise ApiError(422, "key_mismatch", f"the plan's key {plan_key} is not the URL's {key}")
    created = await run_in_threadpool(_store, ctx, key, who.tenant, kind, text)
    PLAN_STORES.labels("created" if created else "known").inc()
    return JSONResponse({"key": key, "created": created}, status_code=201 if created else 200)


@router.get("/plans/{key}", responses={
    200: {"description": "the stored plan", "content": {"application/json": {"schema": _PLAN_SCHEMA}}},
    404: {"description": "no plan for this key in the caller's tenant, nor a published one"},
    422: {"description": "malformed key"}})
async def get_plan(key: str, ctx: Ctx, who: Client) -> Response:
    """200 with the kiln.plan/1 document (canonical JSON) of the caller's tenant for `key`,
    else the one an admin published to all; 404 when there is neither. The service checked
    it as data when it was stored; the client checks it against its own dynamo graph before
    using it."""
    _check_key(key)
    text = await run_in_threadpool(_fetch, ctx, key, who.tenant)
    if text is None:
        PLAN_LOOKUPS.labels("miss").inc()
        raise ApiError(404, "not_found", f"no plan for key {key}; compile and PUT one")
    PLAN_LOOKUPS.labels("hit").inc()
    return Response(text, media_type="application/json")  # stored text as is: no re-encode
