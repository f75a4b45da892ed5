"""JSON errors `{"error": {"code", "message"}}` for everything the API answers."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.queue import QueueUnavailable

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error with its HTTP status, a stable code and a message for the caller."""

    def __init__(self, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error_response(status: int, code: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type",
               429: "rate_limited"}


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception to the JSON error shape; outages to 503, never a bare 500."""

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = f"invalid request at {where}: {first.get('msg', 'malformed')}"
        return error_response(422, "invalid_request", message)

    @app.exception_handler(QueueUnavailable)
    async def _queue_down(_req: Request, exc: QueueUnavailable) -> JSONResponse:
        log.warning("queue unavailable: %s", exc)
        return error_response(503, "queue_unavailable",
                              "the job queue (Redis) is unavailable; retry shortly",
                              {"Retry-After": "2"})

    async def _db_down(_req: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", exc)
        return error_response(503, "database_unavailable",
                              "the database is unavailable; retry shortly", {"Retry-After": "2"})

    app.add_exception_handler(OperationalError, _db_down)
    app.add_exception_handler(PoolTimeout, _db_down)

    @app.exception_handler(DataError)
    async def _unstorable(_req: Request, exc: DataError) -> JSONResponse:
        # Values only reach the database from requests: one it cannot store (a NUL byte, a
        # number out of range) is the client's to fix.
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return error_response(422, "invalid_request", f"a value in the request cannot be stored: {reason}")

    @app.exception_handler(DBAPIError)
    async def _db_error(req: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:
            return await _db_down(req, exc)
        log.exception("database error")
        return error_response(500, "internal", "internal error; it was logged")

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, "internal", "internal error; it was logged")
