"""On a public bind, the API's description is for callers with a token: `/docs`, its static
files and `/openapi.json` answer 401 to anyone else (a bearer token of any role, or an open
dashboard session). On loopback they stay open, like the client endpoints."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from service.api.deps import ADMIN_COOKIE, admin_principal, client_principal
from service.api.openapi import DOCS_STATIC
from service.errors import ApiError, error_response

_DOCS_PATHS = ("/docs", "/openapi.json")


def is_docs_path(path: str) -> bool:
    """Whether `path` is part of the API's description."""
    return path in _DOCS_PATHS or path.startswith(DOCS_STATIC + "/")


class PrivateDocsMiddleware:
    """ASGI middleware: the description needs a caller a client route would accept."""

    def __init__(self, app: Any, loopback: bool) -> None:
        self.app, self.loopback = app, loopback

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.loopback and is_docs_path(scope["path"]):
            request = Request(scope)
            try:
                if "authorization" not in request.headers and ADMIN_COOKIE in request.cookies:
                    await admin_principal(request)  # an operator's browser, logged in
                else:
                    await client_principal(request)
            except ApiError as exc:
                await error_response(exc.status, exc.code, exc.message, exc.headers)(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)
