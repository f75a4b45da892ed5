"""Dependencies shared by routes: the service context, the caller's identity, rate limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from service.auth import (
    Grant,
    Principal,
    hash_token,
    is_configured_admin,
    resolve_token,
    session_is_admin,
)
from service.context import HitBuffer, ServiceContext
from service.errors import ApiError
from service.ratelimit import AuthFailures, FailureThrottle, RateLimiter
from service.tenants import DEFAULT_TENANT, LOCAL_TENANT

ADMIN_COOKIE = "kiln_admin"
MAX_CACHED_TOKENS = 10_000
T = TypeVar("T")


def get_ctx(request: Request) -> ServiceContext:
    """The ServiceContext the app was built with."""
    return request.app.state.ctx


def get_hits(request: Request) -> HitBuffer:
    """The hit counter buffer of this API process."""
    return request.app.state.hits


class TokenRoles:
    """Grants (role, tenant) of presented tokens, kept for `keep_s` (KILN_TOKEN_CACHE_S) so
    a hot path does not query per request: a revoked token stops working within that time.
    Keyed by the token's sha256; the token itself is never kept."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[Grant | None, float]] = {}  # sha256 -> (grant, checked at)

    def known(self, token: str) -> Grant | None:
        """The grant of a token recently found valid, without a query (None: not known)."""
        with self._lock:
            hit = self._cache.get(hash_token(token))
        return hit[0] if hit and time.monotonic() - hit[1] < self.keep_s else None

    async def grant(self, ctx: ServiceContext, token: str) -> Grant | None:
        digest = hash_token(token)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit and now - hit[1] < self.keep_s:
            return hit[0]
        grant = await run_in_threadpool(self._resolve, ctx, token)
        if self.keep_s > 0:
            with self._lock:
                if len(self._cache) >= MAX_CACHED_TOKENS:
                    self._cache.clear()
                self._cache[digest] = (grant, now)
        return grant

    @staticmethod
    def _resolve(ctx: ServiceContext, token: str) -> Grant | None:
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
    if limiter.rate <= 0:  # off: no thread hop to ask a shared limiter for nothing
        return principal
    wait = await _ask(limiter, limiter.allow, principal.ident)
    if wait:
        raise ApiError(429, "rate_limited", f"too many requests; retry in {wait:.2f} s",
                       {"Retry-After": str(max(1, round(wait)))})
    return principal


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _too_many(message: str, wait: float) -> ApiError:
    return ApiError(429, "too_many_failures", f"{message}; retry in {wait:.0f} s",
                    {"Retry-After": str(max(1, round(wait)))})


async def _token_grant(request: Request, ctx: ServiceContext, token: str) -> Grant:
    """The grant of a presented token. A token that failed again and again is refused for a
    while without a lookup (backoff per failing token); any other is checked, and a valid
    one passes whatever its address did. An unknown one counts against the token and its
    address: an address with too many failures gets 429 instead of 401, with backoff, but
    its valid tokens still pass (a flood of bad tokens never locks the operator out)."""
    roles: TokenRoles = request.app.state.token_roles
    known = roles.known(token)
    if known is not None:
        return known
    failures: AuthFailures = request.app.state.auth_failures
    digest = hash_token(token)
    if not is_configured_admin(token, ctx.settings.admin_token):
        wait = await _ask(failures.per_token, failures.per_token.blocked_for,
                          AuthFailures.token_ident(digest))
        if wait:
            raise _too_many("this token failed too often", wait)
    grant = await roles.grant(ctx, token)
    if grant is not None:
        return grant
    token_wait = await _ask(failures.per_token, failures.per_token.failed,
                            AuthFailures.token_ident(digest))
    address_wait = await _ask(failures.per_address, failures.per_address.failed,
                              AuthFailures.address_ident(_address(request)))
    if address_wait:
        raise _too_many("too many unknown tokens from this address", address_wait)
    if token_wait:
        raise _too_many("this token failed too often", token_wait)
    raise ApiError(401, "unauthorized", "unknown or revoked token",
                   {"WWW-Authenticate": "Bearer"})


async def client_principal(request: Request) -> Principal:
    """Caller of a client endpoint: any valid token; no token only on a loopback bind."""
    principal = await _client(request, check=True)
    assert principal is not None
    return principal


async def known_client_principal(request: Request) -> Principal | None:
    """As client_principal, but a token whose grant is not kept (TokenRoles.known) is not
    checked here: None, and nothing counted (the caller then takes client_principal's path,
    which checks it and counts its failures)."""
    return await _client(request, check=False)


async def _client(request: Request, check: bool) -> Principal | None:
    ctx = get_ctx(request)
    token = _bearer(request)
    if token is None:
        if ctx.settings.loopback:
            return await _limit(request, Principal(None, f"ip:{_address(request)}", LOCAL_TENANT))
        raise ApiError(401, "unauthorized", "a bearer token is required (kiln token create)",
                       {"WWW-Authenticate": "Bearer"})
    if check:
        grant = await _token_grant(request, ctx, token)
    else:
        roles: TokenRoles = request.app.state.token_roles
        known = roles.known(token)
        if known is None:
            return None
        grant = known
    return await _limit(request, Principal(grant.role, f"token:{hash_token(token)}",
                                           grant.tenant))


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
        return await _limit(request, Principal("admin", f"session:{hash_token(sid)}",
                                               DEFAULT_TENANT))
    grant = await _token_grant(request, ctx, bearer)
    if grant.role != "admin":
        raise ApiError(403, "forbidden", "this endpoint needs an admin token")
    return await _limit(request, Principal(grant.role, f"token:{hash_token(bearer)}",
                                           grant.tenant))


def _session_is_admin(ctx: ServiceContext, sid: str) -> bool:
    with ctx.transaction() as session:
        return session_is_admin(session, sid, ctx.settings.admin_token)


Ctx = Annotated[ServiceContext, Depends(get_ctx)]
Hits = Annotated[HitBuffer, Depends(get_hits)]
Client = Annotated[Principal, Depends(client_principal)]
Admin = Annotated[Principal, Depends(admin_principal)]
