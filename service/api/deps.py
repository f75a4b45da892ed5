"""Dependencies shared by routes: the service context, the caller's identity, rate limits."""

from __future__ import annotations

import threading
import time
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from service.auth import Principal, hash_token, resolve_token
from service.context import HitBuffer, ServiceContext
from service.errors import ApiError
from service.ratelimit import RateLimiter

ADMIN_COOKIE = "kiln_admin"
_TOKEN_CACHE_S = 30.0  # a revoked token stops working within this long


def get_ctx(request: Request) -> ServiceContext:
    """The ServiceContext the app was built with."""
    return request.app.state.ctx


def get_hits(request: Request) -> HitBuffer:
    """The hit counter buffer of this API process."""
    return request.app.state.hits


class TokenRoles:
    """Roles of presented tokens, cached briefly so a hot path does not query per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def role(self, ctx: ServiceContext, token: str) -> str | None:
        digest = hash_token(token)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit and now - hit[1] < _TOKEN_CACHE_S:
            return hit[0]
        role = await run_in_threadpool(self._resolve, ctx, token)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (role, now)
        return role

    @staticmethod
    def _resolve(ctx: ServiceContext, token: str) -> str | None:
        with ctx.transaction() as session:
            return resolve_token(session, token, ctx.settings.admin_token)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "Authorization header must be 'Bearer <token>'",
                       {"WWW-Authenticate": "Bearer"})
    return token.strip()


def _limit(request: Request, principal: Principal) -> Principal:
    limiter: RateLimiter = request.app.state.limiter
    wait = limiter.allow(principal.ident)
    if wait:
        raise ApiError(429, "rate_limited", f"too many requests; retry in {wait:.2f} s",
                       {"Retry-After": str(max(1, round(wait)))})
    return principal


async def client_principal(request: Request) -> Principal:
    """Caller of a client endpoint: any valid token; no token only on a loopback bind."""
    ctx = get_ctx(request)
    token = _bearer(request)
    if token is None:
        if ctx.settings.loopback:
            host = request.client.host if request.client else "local"
            return _limit(request, Principal(None, f"ip:{host}"))
        raise ApiError(401, "unauthorized", "a bearer token is required (kiln token create)",
                       {"WWW-Authenticate": "Bearer"})
    role = await request.app.state.token_roles.role(ctx, token)
    if role is None:
        raise ApiError(401, "unauthorized", "unknown or revoked token",
                       {"WWW-Authenticate": "Bearer"})
    return _limit(request, Principal(role, f"token:{hash_token(token)}"))


async def admin_principal(request: Request) -> Principal:
    """Caller of an admin endpoint: an admin token, as bearer or the dashboard cookie."""
    ctx = get_ctx(request)
    bearer = _bearer(request)
    token = bearer or request.cookies.get(ADMIN_COOKIE)
    if not token:
        raise ApiError(401, "unauthorized", "an admin token is required",
                       {"WWW-Authenticate": "Bearer"})
    if bearer is None and request.method not in ("GET", "HEAD", "OPTIONS"):
        # A browser sends the cookie with any form post from the same site (another port
        # or subdomain): only reads may ride on it; the dashboard's own forms carry CSRF tokens.
        raise ApiError(403, "forbidden", "state-changing admin calls need the Authorization "
                       "header; the dashboard cookie only allows reads")
    role = await request.app.state.token_roles.role(ctx, token)
    if role is None:
        raise ApiError(401, "unauthorized", "unknown or revoked token",
                       {"WWW-Authenticate": "Bearer"})
    if role != "admin":
        raise ApiError(403, "forbidden", "this endpoint needs an admin token")
    return _limit(request, Principal(role, f"token:{hash_token(token)}"))


Ctx = Annotated[ServiceContext, Depends(get_ctx)]
Hits = Annotated[HitBuffer, Depends(get_hits)]
Client = Annotated[Principal, Depends(client_principal)]
Admin = Annotated[Principal, Depends(admin_principal)]
