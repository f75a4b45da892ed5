"""Dashboard session cookie and CSRF protection.

The admin token lives only in the `kiln_admin` cookie (HttpOnly, SameSite=Strict, Secure
over https), never in a URL. Every state-changing form carries a double-submit CSRF token:
a random value in the `kiln_csrf` cookie that the form must echo in its `csrf_token` field.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import deque
from urllib.parse import urlsplit

from fastapi import Request
from starlette.responses import Response

SESSION_COOKIE = "kiln_admin"
CSRF_COOKIE = "kiln_csrf"
CSRF_FIELD = "csrf_token"
# A browser session; the operator logs in again after a day.
SESSION_MAX_AGE_S = 24 * 3600
# Defence in depth for every page: only our own script runs, nothing frames the dashboard,
# forms post only to it, and pages holding data are never cached. Inline styles stay
# allowed: matplotlib's SVG carries style attributes.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
                               "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_session_cookie(response: Response, request: Request, token: str) -> None:
    """Keep the admin token in an HttpOnly, SameSite=Strict cookie for the whole service."""
    response.set_cookie(SESSION_COOKIE, token, max_age=SESSION_MAX_AGE_S, path="/",
                        httponly=True, samesite="strict", secure=_secure(request))


def clear_session_cookie(response: Response, request: Request) -> None:
    """Log out: expire the session cookie with the same attributes it was set with."""
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                           secure=_secure(request))


def session_token(request: Request) -> str | None:
    """The admin token from the session cookie, or None."""
    return request.cookies.get(SESSION_COOKIE) or None


def csrf_token(request: Request) -> str:
    """The CSRF token for this browser: the cookie's value, or a fresh one to be set."""
    existing = request.cookies.get(CSRF_COOKIE)
    if existing and 20 <= len(existing) <= 100:
        return existing
    token = getattr(request.state, "kiln_csrf", None)
    if token is None:
        token = secrets.token_urlsafe(32)
        request.state.kiln_csrf = token
    return token


def ensure_csrf_cookie(response: Response, request: Request) -> None:
    """Set the CSRF cookie when this request minted a new token."""
    token = getattr(request.state, "kiln_csrf", None)
    if token is not None:
        response.set_cookie(CSRF_COOKIE, token, path="/admin", httponly=True,
                            samesite="strict", secure=_secure(request))


def csrf_valid(request: Request, submitted: str | None) -> bool:
    """True when the form's token equals the cookie's (constant-time comparison)."""
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())


def safe_next(target: str | None) -> str:
    """Where to go after login: only a path inside the dashboard, never another site."""
    if not target:
        return "/admin"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/admin") \
            or parts.path.startswith("/admin/login") or "\\" in target:
        return "/admin"
    return parts.path + (f"?{parts.query}" if parts.query else "")


class LoginThrottle:
    """Refuse logins from an address after `limit` failures within `window_s` seconds, so a
    weak configured admin token cannot be guessed through the form."""

    def __init__(self, limit: int = 10, window_s: float = 60.0) -> None:
        self.limit, self.window_s = limit, window_s
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}

    def blocked_for(self, address: str) -> float:
        """Seconds until `address` may try again (0 when it may now)."""
        now = time.monotonic()
        with self._lock:
            failures = self._failures.get(address)
            if not failures:
                return 0.0
            while failures and now - failures[0] > self.window_s:
                failures.popleft()
            if len(failures) < self.limit:
                return 0.0
            return self.window_s - (now - failures[0])

    def failed(self, address: str) -> None:
        """Record one failed login from `address`."""
        with self._lock:
            if len(self._failures) > 10_000:  # bounded memory under a spray of addresses
                self._failures.clear()
            self._failures.setdefault(address, deque(maxlen=self.limit)).append(time.monotonic())
