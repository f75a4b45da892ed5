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
from service.ratelimit import FailureThrottle

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
    return auth.resolve_token(session, token, settings.admin_token) == "admin"


def is_admin_session(request: Request, session: Session, sid: str) -> bool:
    """True while the dashboard session `sid` is open and its admin token still valid."""
    return auth.session_is_admin(session, sid, request.app.state.ctx.settings.admin_token)


def open_session(request: Request, session: Session, token: str) -> str:
    """Open a dashboard session for a checked admin token; the id goes in the cookie."""
    return auth.create_session(session, token)


def close_session(session: Session, sid: str) -> None:
    """Log out: the session id stops working at once."""
    auth.end_session(session, sid)


def auth_failures(request: Request) -> FailureThrottle:
    """The app's throttle on failed authentication (shared with bearer tokens)."""
    return request.app.state.auth_failures


def queue_depth(request: Request) -> dict[str, int]:
    """Messages waiting per stream; empty (with a warning) when the queue does not answer."""
    try:
        return dict(request.app.state.ctx.queue.depth())
    except QueueUnavailable as exc:
        log.warning("queue depth unavailable: %s", exc)
        return {}
