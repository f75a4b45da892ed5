"""Bounds on what one connection may hold: the size and arrival time of a request's head,
and the arrival time of its body.

The head is bounded in the HTTP protocol (`uvicorn_options`, what `kiln serve` passes to
uvicorn): an ASGI app sees headers only once they are parsed and in memory. With httptools
(uvicorn's fast parser, which has no limit of its own) `BoundedHttpToolsProtocol` counts
the request line and headers and answers 431 past `MAX_HEAD_BYTES`, and 408 when a head
takes longer than `HEAD_TIMEOUT_S` to arrive; with h11, its own incomplete-event limit
applies. The body is bounded by `BodyDeadlineMiddleware`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from typing import Any

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # request line and headers of one request
HEAD_TIMEOUT_S = 10.0  # from a request's first byte to the end of its headers
BODY_TIMED_OUT = "kiln.body_timed_out"  # scope key set when the body deadline passed


class BodyDeadlineMiddleware:
    """A body that stops arriving is not held forever: past `idle_s` without a piece, or
    `total_s` in all (KILN_BODY_IDLE_S, KILN_BODY_TIMEOUT_S), the app's next read sees the
    client as gone (and `scope[BODY_TIMED_OUT]` set, so that the route answers 408). Reads
    after the body is complete (waiting for a disconnect) are not timed."""

    def __init__(self, app: Any, total_s: float, idle_s: float) -> None:
        self.app, self.total_s, self.idle_s = app, total_s, idle_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        state = {"deadline": None, "done": False}

        async def timed_receive() -> dict:
            if state["done"]:
                return await receive()
            if state["deadline"] is None:
                state["deadline"] = loop.time() + self.total_s
            wait = min(self.idle_s, state["deadline"] - loop.time())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except TimeoutError:
                scope[BODY_TIMED_OUT] = True
                state["done"] = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["done"] = True
            return message

        await self.app(scope, timed_receive, send)


def uvicorn_options() -> dict[str, Any]:
    """The protocol options `kiln serve` gives uvicorn so that a request head is bounded."""
    if importlib.util.find_spec("httptools") is not None:
        return {"http": BoundedHttpToolsProtocol}
    return {"http": "h11", "h11_max_incomplete_event_size": MAX_HEAD_BYTES}


def _protocol_base() -> type:
    if importlib.util.find_spec("httptools") is None:
        return object
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


class BoundedHttpToolsProtocol(_protocol_base()):  # type: ignore[misc]
    """uvicorn's httptools protocol with a bounded request head (size and arrival time)."""

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a keep-alive connection's next request
            self._start_head()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._head_bytes > MAX_HEAD_BYTES:  # raised from _count_head inside the parser
            self._refuse(431, "Request Header Fields Too Large",
                         f"request line and headers exceed {MAX_HEAD_BYTES} bytes")
            return
        super().send_400_response(msg)

    # ---- the head's bounds ----
    def _start_head(self) -> None:
        self._head_bytes = 0
        self._head_timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise ValueError("request head too large")  # the parser turns it into a 400 path

    def _head_late(self) -> None:
        self._head_timer = None
        if self.cycle is None or self.cycle.response_complete:  # no request in progress
            self._refuse(408, "Request Timeout",
                         f"request headers did not arrive within {HEAD_TIMEOUT_S:g} s")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        log.warning("%s from %s: %s", status, self.client, message)
        body = message.encode("ascii")
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, reason.encode("ascii"), len(body), body))
        self.transport.close()
