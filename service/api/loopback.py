"""Refuse requests that a web page made a browser send.

A service on loopback needs no token for client calls, so any page a developer visits could
otherwise use it: by DNS rebinding (a name of the attacker's that resolves to 127.0.0.1, so
the browser treats the service as that page's own origin) or by a cross-site "simple"
request (a form or `text/plain` POST, which a browser sends without asking first). Three
checks, before anything reads the body:

- Host: on a loopback bind, only a loopback name (`127.0.0.1`, `localhost`, `[::1]`, any
  port). A rebound name arrives as its own Host header and is refused.
- Origin: a state-changing request (POST, PUT, PATCH, DELETE) that a browser marks as coming
  from another origin (`Origin` naming another host or port, `Origin: null`, or
  `Sec-Fetch-Site: cross-site|same-site`) is refused, on every bind; non-browser clients
  send neither header.
- Content type: a state-changing `/v1` request with a body must say `application/json`;
  a browser cannot send that cross-origin without a CORS preflight, which kiln never grants.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from service.errors import error_response
from service.settings import LOOPBACK_HOSTS

_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_FOREIGN_FETCH_SITES = frozenset({"cross-site", "same-site"})


def _host_name(host: str) -> str:
    """The name part of a Host header value (`[::1]:8000` -> `::1`), lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def refusal(method: str, path: str, headers: dict[str, str], loopback: bool) -> tuple[int, str, str] | None:
    """Why a request must be refused, as (status, code, message), or None to let it through.
    `headers` has lower-case names."""
    host = headers.get("host", "")
    if loopback and _host_name(host) not in LOOPBACK_HOSTS:
        return (421, "host_not_allowed", f"this kiln is bound to loopback and answers only "
                f"Host 127.0.0.1, localhost or [::1], not {host[:100]!r}; to serve other "
                "names, bind a public address (kiln serve --host), where tokens are required")
    if method not in _STATE_CHANGING:
        return None
    origin = headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin.strip())
        if origin.strip() == "null" or not parts.netloc or parts.netloc.lower() != host.lower():
            return (403, "cross_origin", f"a request from the web page at {origin[:100]!r} "
                    "may not change this service")
    elif headers.get("sec-fetch-site") in _FOREIGN_FETCH_SITES:
        return (403, "cross_origin", "a request from another site may not change this service")
    has_body = headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers
    if path.startswith("/v1/") and has_body and not _json_media_type(headers.get("content-type", "")):
        return (415, "unsupported_media_type", "request bodies must be JSON "
                "(Content-Type: application/json)")
    return None


class BrowserGuardMiddleware:
    """ASGI middleware applying `refusal` to every HTTP request."""

    def __init__(self, app: Any, loopback: bool) -> None:
        self.app, self.loopback = app, loopback

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in scope.get("headers", ())}
            refused = refusal(scope["method"], scope["path"], headers, self.loopback)
            if refused is not None:
                response = error_response(*refused)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
