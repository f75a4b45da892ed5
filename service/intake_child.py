"""Submission and plan bodies decoded and validated in a child process: the API's event loop
and heap never hold a client's document.

`json.loads` holds the GIL for as long as it parses, and a body decodes to several times its
size: in a thread of the API, one 16 MiB body of 8M numbers stalled `/healthz` 0.9 s (the
GIL is not given back inside the C parser), and four senders of 16 MiB bodies of small
objects grew the API from 508 to 1166 MB. Each request the intake admits
(`service.intake.IntakeLimiter`) gets a fresh child forked from the forkserver
(`service.forkserver`: kiln and torch loaded, a start in milliseconds), niced below the API,
with its data segment capped (`KILN_INTAKE_MEMORY_MB`) and its wall time too (the parse
budget, `KILN_INTAKE_BUDGET_S`: past it the child is killed), and killed when the client
goes away. The body goes down a pipe as bytes and answers come back as JSON, never pickle;
the child is killed once it has answered, so what it decoded goes back to the system.

The conversation, one `send_bytes` per message:
  API:   {"task": "submission" | "plan", "env": {KILN_* of the API}}, then the body
  child: {"ok": result} or {"error": {"status", "code", "message"}}
and for a submission (result: the `Submission`'s fields), once the API knows whether the
service holds its graph already:
  API:   b"validate" (run its ops on meta tensors) or b"done"
  child: {"ok": null} or {"error": ...}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from service import forkserver
from service.errors import ApiError

log = logging.getLogger(__name__)

NICE = 5  # below the API: its event loop wins a core from a decoding child
_OUT_OF_MEMORY = ("can't allocate memory", "std::bad_alloc")


class IntakeChild:
    """One request's child process (blocking calls: the API makes them on its thread pool).
    `ask` raises ApiError: the child's own, 422 past the budget, 413 when it ran out of
    memory, 400 `cancelled` after `cancel()`."""

    def __init__(self, memory_bytes: int, budget_s: float) -> None:
        self.memory_bytes, self.budget_s = memory_bytes, budget_s
        self.cancelled = False
        ctx = forkserver.context()
        self._conn, child_end = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_serve, name="kiln-intake", daemon=True,
                                 args=(child_end, memory_bytes))
        self._proc.start()
        child_end.close()  # the child holds the only other end: its death reads as EOF
        self._deadline = time.monotonic() + budget_s

    def submission(self, body: bytes) -> dict[str, Any]:
        """The `Submission` fields of a `POST /v1/graphs` body (`service.intake.read_submission`:
        decoded and its graph named, not yet run); then `finish`."""
        return self.ask(_header("submission"), body)

    def finish(self, validate: bool) -> None:
        """Validate the submission's graph (`service.intake.validate_graph`), or not when the
        service holds it already."""
        self.ask(b"validate" if validate else b"done")

    def plan(self, body: bytes) -> dict[str, str]:
        """A kiln.plan/1 body's `key`, `kind` and canonical `text`, checked as data."""
        return self.ask(_header("plan"), body)

    def ask(self, *messages: bytes) -> Any:
        """Send `messages`, then wait for the child's answer within the budget."""
        try:
            for message in messages:
                self._conn.send_bytes(message)
            if not self._conn.poll(max(0.0, self._deadline - time.monotonic())):
                self.kill()
                raise ApiError(422, "intake_budget", f"decoding and validating this body took "
                               f"longer than its budget of {self.budget_s:g} s "
                               "(KILN_INTAKE_BUDGET_S)")
            reply = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            raise self._gone() from None
        if "error" in reply:
            error = reply["error"]
            raise ApiError(error["status"], error["code"], error["message"])
        return reply["ok"]

    def cancel(self) -> None:
        """The client went away: stop the child now (a waiting `ask` raises `cancelled`)."""
        self.cancelled = True
        self.kill()

    def kill(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._proc.kill()

    def close(self) -> None:
        """Kill the child (it has answered, or is no longer wanted) and reap it."""
        self.kill()
        self._proc.join(5)
        self._conn.close()

    def _gone(self) -> ApiError:
        if self.cancelled:
            return ApiError(400, "cancelled", "the client went away; validation stopped")
        self._proc.join(5)
        code = self._proc.exitcode
        if self.memory_bytes and code is not None and code < 0:
            return ApiError(413, "too_large", f"decoding this body was stopped (signal {-code}) "
                            f"within the intake's memory limit of {self.memory_bytes >> 20} MB "
                            "(KILN_INTAKE_MEMORY_MB)")
        log.error("intake child died (exit code %s)", code)
        return ApiError(500, "internal_error", "the process checking this body died")


# ---- in the child --------------------------------------------------------------------------

def _serve(conn: Connection, memory_bytes: int) -> None:
    with contextlib.suppress(OSError):
        os.nice(NICE)
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    with contextlib.suppress(EOFError, BrokenPipeError):  # the API no longer wants an answer
        _answer(conn, memory_bytes)
    conn.close()


def _answer(conn: Connection, memory_bytes: int) -> None:
    header = json.loads(conn.recv_bytes())
    _adopt_env(header["env"])
    try:
        if header["task"] == "plan":
            conn.send_bytes(_ok(_plan(conn.recv_bytes())))
        else:
            _submission(conn)
    except ApiError as exc:
        conn.send_bytes(_error(exc.status, exc.code, exc.message))
    except MemoryError:
        conn.send_bytes(_out_of_memory(memory_bytes))
    except Exception as exc:  # noqa: BLE001 - reported to the API, which logs it
        if any(mark in str(exc) for mark in _OUT_OF_MEMORY):
            conn.send_bytes(_out_of_memory(memory_bytes))
        else:
            conn.send_bytes(_error(500, "internal_error", f"{type(exc).__name__}: {exc}"[:500]))


def _adopt_env(env: dict[str, str]) -> None:
    """The API's KILN_* settings now (the wire limits are read from the environment each
    time): the forkserver's environment is the API's as it was when the server started."""
    for name in [n for n in os.environ if n.startswith("KILN_") and n not in env]:
        del os.environ[name]
    os.environ.update(env)


def _submission(conn: Connection) -> None:
    from service.intake import read_submission, validate_graph

    sub, graph = read_submission(conn.recv_bytes())
    conn.send_bytes(_ok(asdict(sub)))
    if conn.recv_bytes() == b"validate":
        validate_graph(graph)
    conn.send_bytes(_ok(None))


def _plan(body: bytes) -> dict[str, str]:
    """A plan body's key, kind and canonical text; ApiError 422 naming what is wrong."""
    from compiler.wire.plan import PlanError, parse_plan, plan_text
    from service.intake import document_errors

    with document_errors("plan"):
        try:
            plan = parse_plan(body)
        except PlanError as exc:  # its message already says "plan: ..."
            raise ApiError(422, "invalid_plan", str(exc)) from None
    return {"key": plan.key, "kind": plan.kind, "text": plan_text(plan)}


def _ok(result: Any) -> bytes:
    return json.dumps({"ok": result}).encode()


def _error(status: int, code: str, message: str) -> bytes:
    return json.dumps({"error": {"status": status, "code": code, "message": message}}).encode()


def _out_of_memory(memory_bytes: int) -> bytes:
    return _error(413, "too_large", f"decoding this body needs more memory than the intake's "
                  f"limit of {memory_bytes >> 20} MB (KILN_INTAKE_MEMORY_MB)")


def _header(task: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if k.startswith("KILN_")}
    return json.dumps({"task": task, "env": env}).encode()
