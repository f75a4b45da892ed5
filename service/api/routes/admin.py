"""Admin routes under `/v1/admin`: thin wrappers over service.store.admin."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from service.api.deps import Admin, Ctx
from service.api.routes.schedules import KEY_RE
from service.errors import ApiError
from service.queue import QueueUnavailable
from service.store import admin, plans
from service.tenants import ALL_TENANTS, check_tenant

router = APIRouter(prefix="/v1/admin", tags=["admin"])


def _bad(exc: ValueError) -> ApiError:
    return ApiError(422, "invalid_request", str(exc))


def _known_key(key: str, what: str = "entry") -> str:
    if not KEY_RE.match(key):
        raise ApiError(404, "not_found", f"no such {what}: a key is 64 lowercase hex digits")
    return key


def _found(item: dict[str, Any] | None, key: str) -> dict[str, Any]:
    if item is None:
        raise ApiError(404, "not_found", f"no entry {key}")
    return item


@router.get("/entries")
def entries(ctx: Ctx, _who: Admin, q: str | None = Query(None, max_length=64),
            target: str | None = Query(None, max_length=128),
            status: str | None = None, tag: str | None = Query(None, max_length=200),
            sort: str = "last_used", order: str = "desc",
            page: int = Query(1, ge=1, le=1_000_000),
            per_page: int = Query(50, ge=1, le=admin.MAX_PER_PAGE)) -> dict[str, Any]:
    """List and filter entries, a page at a time."""
    try:
        with ctx.transaction() as session:
            return admin.list_entries(session, q=q, target=target, status=status,
                                              tag=tag, sort=sort, order=order, page=page,
                                              per_page=per_page)
    except ValueError as exc:
        raise _bad(exc) from None


@router.get("/entries/{key}")
def entry(key: str, ctx: Ctx, _who: Admin) -> dict[str, Any]:
    """One entry with kernels, sources, measurements and its job."""
    with ctx.transaction() as session:
        detail = admin.entry_detail(session, _known_key(key))
    return _found(detail, key)


@router.post("/entries/{key}/invalidate")
def invalidate(key: str, request: Request, ctx: Ctx, _who: Admin) -> dict[str, Any]:
    """Withdraw an entry's schedule."""
    with ctx.transaction() as session:
        item = admin.invalidate(session, _known_key(key))
    request.app.state.lookups.forget(key)  # other API processes: within KILN_LOOKUP_CACHE_S
    return _found(item, key)


@router.post("/entries/{key}/retune", status_code=202)
def retune(key: str, request: Request, ctx: Ctx, _who: Admin) -> JSONResponse:
    """Queue the entry for tuning again."""
    with ctx.transaction() as session:
        job = admin.retune(session, _known_key(key))
    request.app.state.lookups.forget(key)  # its job is queued again: `job_status` changed
    return JSONResponse(_found(job, key), status_code=202)


def _tenant_param(tenant: str | None) -> str | None:
    """A tenant named in a query: a tenant's name, or `*` for the published plans."""
    if tenant is None or tenant == ALL_TENANTS:
        return tenant
    try:
        return check_tenant(tenant)
    except ValueError as exc:
        raise _bad(exc) from None


@router.get("/plans")
def list_plans(ctx: Ctx, _who: Admin, key: str | None = Query(None, max_length=64),
               tenant: str | None = Query(None, max_length=64),
               limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
    """Stored plans, newest first (not their bodies): key, tenant (`*`: published to all),
    kind, bytes, created_at, hits, last_hit_at, published_from."""
    if key is not None:
        _known_key(key, "plan")
    with ctx.transaction() as session:
        return {"items": plans.list_plans(session, key=key, tenant=_tenant_param(tenant),
                                          limit=limit)}


@router.post("/plans/{key}/publish")
def publish_plan(key: str, ctx: Ctx, _who: Admin,
                 tenant: str = Query(..., max_length=64)) -> dict[str, Any]:
    """Publish `tenant`'s plan for `key` to every tenant: a tenant without its own plan for
    the key reads this one. 409 when another plan is published for the key."""
    name = _tenant_param(tenant)
    if name == ALL_TENANTS:
        raise ApiError(422, "invalid_request", "name the tenant whose plan to publish")
    with ctx.transaction() as session:
        try:
            published = plans.publish_plan(session, _known_key(key, "plan"), name)
        except ValueError as exc:
            raise ApiError(409, "conflict", str(exc)) from None
    if published is None:
        raise ApiError(404, "not_found", f"tenant {name} holds no plan {key}")
    return {"key": key, "tenant": name, "published": True, "created": published}


@router.post("/plans/{key}/invalidate")
def invalidate_plan(key: str, ctx: Ctx, _who: Admin,
                    tenant: str | None = Query(None, max_length=64)) -> dict[str, Any]:
    """Delete the key's plans: every tenant's and the published one, or only `tenant`'s
    (`*`: only the published one). Clients miss and store the one their next compile makes."""
    name = _tenant_param(tenant)
    with ctx.transaction() as session:
        deleted = plans.delete_plan(session, _known_key(key, "plan"), name)
    if not deleted:
        raise ApiError(404, "not_found", f"no plan {key}" + (f" of tenant {name}" if name else ""))
    return {"key": key, "invalidated": True, "deleted": deleted}


@router.get("/stats")
def stats(ctx: Ctx, _who: Admin) -> dict[str, Any]:
    """Hits, misses by reason, queue depth, workers, plans stored."""
    try:
        depth: Any = ctx.queue.depth()
    except QueueUnavailable:
        depth = {}
    with ctx.transaction() as session:
        return admin.stats(session, depth)


@router.get("/jobs")
def jobs(ctx: Ctx, _who: Admin, status: str | None = None,
         limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
    """Recent jobs."""
    try:
        with ctx.transaction() as session:
            return admin.list_jobs(session, status=status, limit=limit)
    except ValueError as exc:
        raise _bad(exc) from None
