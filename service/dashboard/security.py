"""Dashboard session cookie and CSRF protection.

Logging in opens a server-side session (service.auth): the `kiln_admin` cookie (HttpOnly,
SameSite=Strict, Secure over https) holds only its random id, never the admin token, and
logout deletes it. Every state-changing form carries a CSRF token: with a session, an HMAC
of the session id (unknowable to another page, even one that can plant cookies from another
port of the same host); before login, a random value double-submitted in the `kiln_csrf`
cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from fastapi import Request
from starlette.responses import Response

SESSION_COOKIE = "kiln_admin"
CSRF_COOKIE = "kiln_csrf"
CSRF_FIELD = "csrf_token"
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


def set_session_cookie(response: Response, request: Request, sid: str, max_age_s: int) -> None:
    """Keep the session id in an HttpOnly, SameSite=Strict cookie for the whole service."""
    response.set_cookie(SESSION_COOKIE, sid, max_age=max_age_s, path="/",
                        httponly=True, samesite="strict", secure=_secure(request))


def clear_session_cookie(response: Response, request: Request) -> None:
    """Log out: expire the session cookie with the same attributes it was set with."""
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                           secure=_secure(request))


def session_id(request: Request) -> str | None:
    """The session id from the session cookie, or None."""
    return request.cookies.get(SESSION_COOKIE) or None


def _session_csrf(sid: str) -> str:
    return hmac.new(sid.encode(), b"kiln-dashboard-csrf", hashlib.sha256).hexdigest()


def csrf_token(request: Request) -> str:
    """The CSRF token for this browser: bound to its session id when it has one, else the
    double-submit cookie's value (or a fresh one to be set)."""
    sid = session_id(request)
    if sid is not None:
        return _session_csrf(sid)
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
    """True when the form's token is the one `csrf_token` gives this request (constant-time
    comparison)."""
    sid = session_id(request)
    expected = _session_csrf(sid) if sid is not None else request.cookies.get(CSRF_COOKIE)
    if not expected or not submitted:
        return False
    return hmac.compare_digest(expected.encode(), submitted.encode())


def safe_next(target: str | None) -> str:
    """Where to go after login: only a path inside the dashboard, never another site."""
    if not target:
        return "/admin"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/admin") \
            or parts.path.startswith("/admin/login") or "\\" in target:
        return "/admin"
    return parts.path + (f"?{parts.query}" if parts.query else "")
