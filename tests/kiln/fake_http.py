"""Tiny scriptable HTTP servers for client fault tests (garbage, 5xx, slow, hangs, trickles).

`handler(method, path, body) -> (status, headers, bytes)` decides each answer (status 0:
close the connection without one); every request is recorded in `requests` as
(method, path, body, headers). Requests for plans (`/v1/plans/...`, kiln.plans) never
reach the handler unless `plans=True`: the server answers them as a service that has none
and stores what it is sent (404 and 201). Nor does, unless `lookups=True`, a schedule lookup
(`GET /v1/schedules/{key}`) of a key no graph was submitted for: the server answers it as
a service that starts empty (404 `not_found`, the client then submits) and records it in
`lookups`. This is not the kiln service: tests that need the real service start it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, str], bytes]
Handler = Callable[[str, str, Any], Reply]


_SCHEDULES = "/v1/schedules/"


def json_reply(status: int, doc: Any) -> Reply:
    """An answer with a JSON body."""
    return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()


class FakeServer:
    """Serve `handler` on 127.0.0.1 in a daemon thread; use as a context manager."""

    def __init__(self, handler: Handler, port: int = 0, lookups: bool = False,
                 plans: bool = False) -> None:
        self.handler = handler
        self.requests: list[tuple[str, str, Any, dict[str, str]]] = []
        self.lookups: list[str] = []  # keys looked up before any submission of theirs
        self._submitted: set[str] = set()
        outer = self

        class _H(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                if self.path.startswith("/v1/plans/") and not plans:
                    status, headers, data = _no_plans(method)
                elif not lookups and outer._unknown_lookup(method, self.path):
                    outer.lookups.append(self.path.rsplit("/", 1)[-1])
                    status, headers, data = json_reply(404, {"error": {
                        "code": "not_found", "message": "no schedule; submit the graph"}})
                else:
                    outer._note_submission(method, self.path, body)
                    outer.requests.append((method, self.path, body, dict(self.headers)))
                    status, headers, data = outer.handler(method, self.path, body)
                if status == 0:  # close the connection without answering
                    self.close_connection = True
                    return
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (timeout tests)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._serve("PUT")

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _H)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _unknown_lookup(self, method: str, path: str) -> bool:
        return (method == "GET" and path.startswith(_SCHEDULES)
                and path[len(_SCHEDULES):] not in self._submitted)

    def _note_submission(self, method: str, path: str, body: Any) -> None:
        if method != "POST" or path != "/v1/graphs" or not isinstance(body, dict):
            return
        import compiler

        try:
            key = compiler.tuning_key(compiler.from_wire(body["graph"]),
                                      compiler.Target.from_json(body["target"]))
        except Exception:  # noqa: BLE001 - a malformed submission: the handler's to answer
            return
        self._submitted.add(key)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving and close the socket (later connections are refused)."""
        self._server.shutdown()
        self._server.server_close()


class TricklingServer:
    """Answer every connection with raw bytes (status line, headers, body) after reading the
    request head: `prefix` at once, then `trickle` one byte every `interval` seconds, a
    server never silent for long but never done. `served` counts the trickled bytes sent."""

    def __init__(self, prefix: bytes, trickle: bytes, interval: float) -> None:
        self.prefix, self.trickle, self.interval, self.served = prefix, trickle, interval, 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and not self._stop.is_set():
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            try:
                conn.sendall(self.prefix)
            except OSError:
                return
            for i in range(len(self.trickle)):
                if self._stop.wait(self.interval):
                    return
                try:
                    conn.sendall(self.trickle[i:i + 1])
                except OSError:
                    return  # the client gave up
                self.served += 1

    def __enter__(self) -> TricklingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


def _no_plans(method: str) -> Reply:
    """What a service that holds no plans answers (and it stores what it is sent)."""
    if method == "PUT":
        return json_reply(201, {"created": True})
    return json_reply(404, {"error": "not_found", "detail": "no plan"})
