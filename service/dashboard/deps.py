"""The dashboard's only links to the rest of the service: the unit of work, the admin-token
check and the queue depths. Kept in one place so the pages never reach into service internals.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from sqlalchemy.orm import Session

from service.auth import resolve_token
from service.queue import QueueUnavailable

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
    return resolve_token(session, token, settings.admin_token) == "admin"


def queue_depth(request: Request) -> dict[str, int]:
    """Messages waiting per stream; empty (with a warning) when the queue does not answer."""
    try:
        return dict(request.app.state.ctx.queue.depth())
    except QueueUnavailable as exc:
        log.warning("queue depth unavailable: %s", exc)
        return {}
