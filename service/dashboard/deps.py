"""The dashboard's only links to the rest of the service: the unit of work, the admin-token
check and the queue depths. Kept in one place so the pages never reach into service internals.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from sqlalchemy.orm import Session

from service import auth
from service.queue import QueueUnavailable
from service.ratelimit import AuthFailures

log = logging.getLogger(__name__)


@contextmanager
def transaction(request: Request) -> Iterator[Session]:
    """One unit of work for a page or action, committed before the response is sent (so a
    redirect after an action always shows its effect). Jobs queued inside it are enqueued
    on commit by the service's session hooks."""
    with request.app.state.ctx.transaction() as session:
        yield session


def is_admin_token(request: Request, session: Session, token: str) -> bool:
    """True when `token` is the configured admin token or a stored, unrevoked admin token.
    Checked on every request without a cache, so a revoked token stops at once."""
    settings = request.app.state.ctx.settings
    grant = auth.resolve_token(session, token, settings.admin_token)
    return grant is not None and grant.role == "admin"


def is_admin_session(request: Request, session: Session, sid: str) -> bool:
    """True while the dashboard session `sid` is open and its admin token still valid."""
    return auth.session_is_admin(session, sid, request.app.state.ctx.settings.admin_token)


def open_session(request: Request, session: Session, token: str) -> str:
    """Open a dashboard session for a checked admin token; the id goes in the cookie."""
    return auth.create_session(session, token)


def close_session(session: Session, sid: str) -> None:
    """Log out: the session id stops working at once."""
    auth.end_session(session, sid)


def _failures(request: Request) -> AuthFailures:
    """The app's throttles on failed authentication (shared with bearer tokens)."""
    return request.app.state.auth_failures


def token_blocked_for(request: Request, token: str) -> float:
    """Seconds until this token may be tried again: one refused again and again is not
    checked for a while (the configured admin token is never held back)."""
    if auth.is_configured_admin(token, request.app.state.ctx.settings.admin_token):
        return 0.0
    return _failures(request).per_token.blocked_for(
        AuthFailures.token_ident(auth.hash_token(token)))


def login_failed(request: Request, token: str, address: str) -> float:
    """Count a refused login against its token and its address; the seconds either is now
    refused for (0: answer 401, not 429)."""
    failures = _failures(request)
    return max(failures.per_token.failed(AuthFailures.token_ident(auth.hash_token(token))),
               failures.per_address.failed(AuthFailures.address_ident(address)))


def queue_depth(request: Request) -> dict[str, int]:
    """Messages waiting per stream; empty (with a warning) when the queue does not answer."""
    try:
        return dict(request.app.state.ctx.queue.depth())
    except QueueUnavailable as exc:
        log.warning("queue depth unavailable: %s", exc)
        return {}
