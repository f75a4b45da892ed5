"""Submission and plan bodies decoded and validated in a child process: the API's event loop
and heap never hold a client's document.

`json.loads` holds the GIL for as long as it parses, and a body decodes to several times its
size: in a thread of the API, one 16 MiB body of 8M numbers stalled `/healthz` 0.9 s (the
GIL is not given back inside the C parser), and four senders of 16 MiB bodies of small
objects grew the API from 508 to 1166 MB. Each request the intake admits
(`service.intake.IntakeLimiter`) gets a fresh child forked from the warm server
(`service.forkserver.checks`: kiln and torch loaded, a start in milliseconds), niced below
the API, with its data segment capped (`KILN_INTAKE_MEMORY_MB`) and its wall time too (the
parse budget, `KILN_INTAKE_BUDGET_S`: the child's deadline, past which it is killed), and
killed when the client goes away (`compiler.child`). The body goes down as raw bytes and
answers come back as JSON, never pickle; the child is killed once it has answered, so what
it decoded goes back to the system.

This child answers the submitter before a job is queued: it decodes, names and validates
the graph (on meta tensors) so that a bad graph is a 4xx now. The job's build parses the
stored graph again in its own child (`service.build_child`), possibly on another host.

The conversation, one message each:
  API:   {"task": "submission" | "plan", "env": {KILN_* of the API}}, then the body (bytes)
  child: {"ok": result} or {"error": {"status", "code", "message"}}
and for a submission (result: the `Submission`'s fields), once the API knows whether the
service holds its graph already:
  API:   "validate" (run its ops on meta tensors) or "done"
  child: {"ok": null} or {"error": ...}
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from typing import Any

from compiler.child import Channel, ChildDied, ChildTimeout, Limits, MessageTooLarge
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
        self._proc = forkserver.checks.start(
            "service.intake_child:_serve", [memory_bytes], name="intake",
            limits=Limits(memory_bytes=memory_bytes, nice=NICE), deadline_s=budget_s)

    def submission(self, body: bytes) -> dict[str, Any]:
        """The `Submission` fields of a `POST /v1/graphs` body (`service.intake.read_submission`:
        decoded and its graph named, not yet run); then `finish`."""
        return self.ask(_header("submission"), body)

    def finish(self, validate: bool) -> None:
        """Validate the submission's graph (`service.intake.validate_graph`), or not when the
        service holds it already."""
        self.ask("validate" if validate else "done")

    def plan(self, body: bytes) -> dict[str, str]:
        """A kiln.plan/1 body's `key`, `kind` and canonical `text`, checked as data."""
        return self.ask(_header("plan"), body)

    def ask(self, *messages: Any) -> Any:
        """Send `messages` (bytes go as bytes, the rest as JSON), then wait for the child's
        answer within the budget."""
        try:
            for message in messages:
                if isinstance(message, bytes):
                    self._proc.send_bytes(message)
                else:
                    self._proc.send(message)
            reply = self._proc.recv()
        except ChildTimeout:
            raise ApiError(422, "intake_budget", f"decoding and validating this body took "
                           f"longer than its budget of {self.budget_s:g} s "
                           "(KILN_INTAKE_BUDGET_S)") from None
        except MessageTooLarge as exc:
            raise ApiError(413, "too_large", f"this body is too large for the intake: {exc}") from None
        except ChildDied as died:
            raise self._gone(died.exitcode) from None
        if "error" in reply:
            error = reply["error"]
            raise ApiError(error["status"], error["code"], error["message"])
        return reply["ok"]

    def cancel(self) -> None:
        """The client went away: stop the child now (a waiting `ask` raises `cancelled`)."""
        self.cancelled = True
        self._proc.kill()

    def close(self) -> None:
        """Kill the child (it has answered, or is no longer wanted) and reap it."""
        self._proc.close()

    def _gone(self, code: int | None) -> ApiError:
        if self.cancelled:
            return ApiError(400, "cancelled", "the client went away; validation stopped")
        if self.memory_bytes and code is not None and code < 0:
            return ApiError(413, "too_large", f"decoding this body was stopped (signal {-code}) "
                            f"within the intake's memory limit of {self.memory_bytes >> 20} MB "
                            "(KILN_INTAKE_MEMORY_MB)")
        log.error("intake child died (exit code %s)", code)
        return ApiError(500, "internal_error", "the process checking this body died")


# ---- in the child --------------------------------------------------------------------------

def _serve(channel: Channel, memory_bytes: int) -> None:
    header = channel.recv()
    _adopt_env(header["env"])
    try:
        if header["task"] == "plan":
            channel.send(_ok(_plan(channel.recv_bytes())))
        else:
            _submission(channel)
    except ApiError as exc:
        channel.send(_error(exc.status, exc.code, exc.message))
    except MemoryError:
        channel.send(_out_of_memory(memory_bytes))
    except Exception as exc:  # noqa: BLE001 - reported to the API, which logs it
        if any(mark in str(exc) for mark in _OUT_OF_MEMORY):
            channel.send(_out_of_memory(memory_bytes))
        else:
            channel.send(_error(500, "internal_error", f"{type(exc).__name__}: {exc}"[:500]))


def _adopt_env(env: dict[str, str]) -> None:
    """The API's KILN_* settings now (the wire limits are read from the environment each
    time): the forkserver's environment is the API's as it was when the server started."""
    for name in [n for n in os.environ if n.startswith("KILN_") and n not in env]:
        del os.environ[name]
    os.environ.update(env)


def _submission(channel: Channel) -> None:
    from service.intake import read_submission, validate_graph

    sub, graph = read_submission(channel.recv_bytes())
    channel.send(_ok(asdict(sub)))
    if channel.recv() == "validate":
        validate_graph(graph)
    channel.send(_ok(None))


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


def _ok(result: Any) -> dict[str, Any]:
    return {"ok": result}


def _error(status: int, code: str, message: str) -> dict[str, Any]:
    return {"error": {"status": status, "code": code, "message": message}}


def _out_of_memory(memory_bytes: int) -> dict[str, Any]:
    return _error(413, "too_large", f"decoding this body needs more memory than the intake's "
                  f"limit of {memory_bytes >> 20} MB (KILN_INTAKE_MEMORY_MB)")


def _header(task: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k.startswith("KILN_")}
    return {"task": task, "env": env}
