"""Dependencies shared by routes: the service context, the caller's identity, rate limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from service.auth import Principal, hash_token, resolve_token, session_is_admin
from service.context import HitBuffer, ServiceContext
from service.errors import ApiError
from service.ratelimit import FailureThrottle, RateLimiter

ADMIN_COOKIE = "kiln_admin"
_TOKEN_CACHE_S = 30.0  # a revoked token stops working within this long
T = TypeVar("T")


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

    def known(self, token: str) -> str | None:
        """The role of a token recently found valid, without a query (None: not known)."""
        with self._lock:
            hit = self._cache.get(hash_token(token))
        return hit[0] if hit and time.monotonic() - hit[1] < _TOKEN_CACHE_S else None

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


async def _ask(limiter: RateLimiter | FailureThrottle, method: Callable[[str], T], arg: str) -> T:
    """A limiter's answer; one shared through Redis is asked off the event loop."""
    return await run_in_threadpool(method, arg) if limiter.shared else method(arg)


async def _limit(request: Request, principal: Principal) -> Principal:
    limiter: RateLimiter = request.app.state.limiter
    wait = await _ask(limiter, limiter.allow, principal.ident)
    if wait:
        raise ApiError(429, "rate_limited", f"too many requests; retry in {wait:.2f} s",
                       {"Retry-After": str(max(1, round(wait)))})
    return principal


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def _token_role(request: Request, ctx: ServiceContext, token: str) -> str:
    """The role of a presented token. Unknown tokens count against the caller's address; an
    address with too many is refused for a while (a token recently valid still passes, so
    one guesser behind a shared address does not lock out the fleet behind it)."""
    roles: TokenRoles = request.app.state.token_roles
    known = roles.known(token)
    if known is not None:
        return known
    throttle: FailureThrottle = request.app.state.auth_failures
    wait = await _ask(throttle, throttle.blocked_for, _address(request))
    if wait:
        raise ApiError(429, "too_many_failures", f"too many unknown tokens from this address; "
                       f"retry in {wait:.0f} s", {"Retry-After": str(max(1, round(wait)))})
    role = await roles.role(ctx, token)
    if role is None:
        await _ask(throttle, throttle.failed, _address(request))
        raise ApiError(401, "unauthorized", "unknown or revoked token",
                       {"WWW-Authenticate": "Bearer"})
    return role


async def client_principal(request: Request) -> Principal:
    """Caller of a client endpoint: any valid token; no token only on a loopback bind."""
    ctx = get_ctx(request)
    token = _bearer(request)
    if token is None:
        if ctx.settings.loopback:
            return await _limit(request, Principal(None, f"ip:{_address(request)}"))
        raise ApiError(401, "unauthorized", "a bearer token is required (kiln token create)",
                       {"WWW-Authenticate": "Bearer"})
    role = await _token_role(request, ctx, token)
    return await _limit(request, Principal(role, f"token:{hash_token(token)}"))


async def admin_principal(request: Request) -> Principal:
    """Caller of an admin endpoint: an admin token as bearer, or (reads only) the
    dashboard's session cookie."""
    ctx = get_ctx(request)
    bearer = _bearer(request)
    if bearer is None:
        sid = request.cookies.get(ADMIN_COOKIE)
        if not sid:
            raise ApiError(401, "unauthorized", "an admin token is required",
                           {"WWW-Authenticate": "Bearer"})
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            # A browser sends the cookie with any form post from the same site (another
            # port or subdomain): only reads may ride on it; the dashboard's own forms carry
            # CSRF tokens.
            raise ApiError(403, "forbidden", "state-changing admin calls need the "
                           "Authorization header; the dashboard cookie only allows reads")
        if not await run_in_threadpool(_session_is_admin, ctx, sid):
            raise ApiError(401, "unauthorized", "the dashboard session ended; log in again",
                           {"WWW-Authenticate": "Bearer"})
        return await _limit(request, Principal("admin", f"session:{hash_token(sid)}"))
    role = await _token_role(request, ctx, bearer)
    if role != "admin":
        raise ApiError(403, "forbidden", "this endpoint needs an admin token")
    return await _limit(request, Principal(role, f"token:{hash_token(bearer)}"))


def _session_is_admin(ctx: ServiceContext, sid: str) -> bool:
    with ctx.transaction() as session:
        return session_is_admin(session, sid, ctx.settings.admin_token)


Ctx = Annotated[ServiceContext, Depends(get_ctx)]
Hits = Annotated[HitBuffer, Depends(get_hits)]
Client = Annotated[Principal, Depends(client_principal)]
Admin = Annotated[Principal, Depends(admin_principal)]
