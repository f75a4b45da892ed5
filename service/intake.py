"""Turn a `POST /v1/graphs` body into a validated submission, or a clear 4xx error.

The API reads a body (`read_body`: Content-Length checked before a byte is read, the size
counted as it streams) within the intake's slots (`IntakeLimiter`); decoding and validating
it happen in a child process (`intake_child`, `service.intake_child`), never on the API's
event loop or heap."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from service.api.limits import BODY_TIMED_OUT
from service.errors import ApiError
from service.intake_child import IntakeChild
from service.store import Submission

log = logging.getLogger(__name__)
MAX_TAG = 200


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything over `limit` bytes before reading it all,
    and (408) a body that stopped arriving (`service.api.limits.BodyDeadlineMiddleware`)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "bad_request", "Content-Length is not a number") from None
        if size > limit:
            raise ApiError(413, "too_large", f"request body of {size} bytes exceeds the limit of {limit}")
    chunks, total = [], 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise ApiError(413, "too_large", f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        if request.scope.get(BODY_TIMED_OUT):
            raise ApiError(408, "body_timeout", "the request body did not arrive in time; "
                           "send it at once") from None
        raise ApiError(400, "bad_request", "the client disconnected before sending the body") from None
    return b"".join(chunks)


class IntakeLimiter:
    """At most `slots` submissions read and validated at once, holding at most `max_bytes`
    of bodies between them (weighed by Content-Length, or the body limit when a body does
    not declare it; one body alone is always let in). A submission waits up to `wait_s` for
    room, then gets 503: the memory and CPU that submissions take stay bounded, and so
    does the thread pool, so `/healthz` and schedule reads keep answering."""

    def __init__(self, slots: int, max_bytes: int, wait_s: float) -> None:
        self.slots, self.max_bytes, self.wait_s = slots, max_bytes, wait_s
        self.in_flight, self.bytes = 0, 0
        self._changed = asyncio.Condition()

    def _fits(self, weight: int) -> bool:
        return self.in_flight == 0 or (self.in_flight < self.slots
                                       and self.bytes + weight <= self.max_bytes)

    @asynccontextmanager
    async def admit(self, weight: int) -> AsyncIterator[None]:
        """Hold a place for one submission of `weight` bytes; ApiError 503 when none frees in time."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self._fits(weight)),
                                       self.wait_s)
            except TimeoutError:
                raise ApiError(503, "busy", "the service is validating as many graphs as it "
                               "may; retry shortly", headers={"Retry-After": "1"}) from None
            self.in_flight += 1
            self.bytes += weight
        try:
            yield
        finally:
            async with self._changed:
                self.in_flight -= 1
                self.bytes -= weight
                self._changed.notify_all()


def limiter_of(request: Request) -> IntakeLimiter:
    """The app's IntakeLimiter, made from its settings on first use."""
    state = request.app.state
    if getattr(state, "intake_limiter", None) is None:
        settings = state.settings
        state.intake_limiter = IntakeLimiter(settings.intake_slots,
                                             max(settings.intake_bytes, settings.body_limit),
                                             settings.intake_wait_s)
    return state.intake_limiter


def body_weight(request: Request, limit: int) -> int:
    """What a body will hold: its declared Content-Length, else the body limit."""
    try:
        return min(int(request.headers.get("content-length", limit)), limit)
    except ValueError:
        return limit


class ChildIntake:
    """A request's `IntakeChild` for the event loop: each exchange on the thread pool."""

    def __init__(self, child: IntakeChild) -> None:
        self._child = child

    async def submission(self, body: bytes) -> Submission:
        """The body decoded and its graph named (`read_submission`, in the child)."""
        return Submission(**await run_in_threadpool(self._child.submission, body))

    async def finish(self, validate: bool) -> None:
        """Validate the graph (`validate_graph`, in the child), or not when it is known."""
        await run_in_threadpool(self._child.finish, validate)

    async def plan(self, body: bytes) -> dict[str, str]:
        """A plan body's `key`, `kind` and canonical `text` (in the child)."""
        return await run_in_threadpool(self._child.plan, body)


@asynccontextmanager
async def intake_child(request: Request) -> AsyncIterator[ChildIntake]:
    """A child process that decodes and validates this request's body
    (`service.intake_child`), killed when the client disconnects (its exchange then raises
    ApiError "cancelled") and once the request is done with it."""
    settings = request.app.state.settings
    child = await run_in_threadpool(IntakeChild, settings.intake_memory_mb << 20,
                                    settings.intake_budget_s)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        child.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield ChildIntake(child)
    except ApiError as exc:
        if exc.code == "cancelled":
            log.info("validation for %s stopped: the client went away", request.url.path)
        raise
    finally:
        watcher.cancel()
        await run_in_threadpool(child.close)


def warm_intake(settings: Any) -> None:
    """Start the fork server (`service.forkserver.checks`: kiln, torch and Triton imported:
    seconds) and check one small graph through an intake child, at startup: otherwise the first submissions each wait on
    those imports together, and on an H200 host three of them (a training graph's forward
    and backward, its plan) outlasted their client's 10 s timeout: it built both graphs
    locally, its poller got only one of them to the service before the process ended, and
    the plan was lost."""
    import json

    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    import compiler

    x = torch.ones(2, 2)
    graph = compiler.to_wire(make_fx(lambda t: (t + 1,))(x), [x])
    body = json.dumps({"graph": graph, "target": compiler.Target.detect("cpu").to_json()})
    child = IntakeChild(settings.intake_memory_mb << 20, settings.intake_budget_s)
    try:
        child.submission(body.encode())
        child.finish(validate=True)
    finally:
        child.close()


def _field(obj: dict[str, Any], name: str) -> Any:
    if name not in obj:
        raise ApiError(422, "invalid_request", f"the body has no '{name}' field; send "
                       '{"graph": <kiln.graph/1>, "target": <target>}')
    return obj[name]


def parse_submission(body: bytes, cancel: threading.Event | None = None) -> tuple[Submission, Any]:
    """Validate a submission body; returns the Submission and the parsed compiler.Graph
    (`read_submission`, then `validate_graph`)."""
    sub, graph = read_submission(body)
    return sub, validate_graph(graph, cancel)


def read_submission(body: bytes) -> tuple[Submission, Any]:
    """Decode a submission body and name its graph without running it
    (`compiler.wire.graph.identify`: schema, op allowlist, limits); returns the Submission
    and the named graph (`WireIdentity`), which `validate_graph` checks before anything new
    is stored.
    Every problem a client can cause becomes an ApiError 422 naming what is wrong. The body
    is decoded with the wire format's budgets (objects, arrays, repeated keys)."""
    import compiler
    from compiler.wire.graph import identify

    try:
        obj = compiler.parse_json(body, max_bytes=len(body))
    except ValueError as exc:
        raise ApiError(422, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_request", "the body must be a JSON object")
    raw_graph, raw_target = _field(obj, "graph"), _field(obj, "target")
    tag = obj.get("tag")
    # printable: no line breaks, terminal escapes or bidi overrides to spoof pages and logs
    if tag is not None and (not isinstance(tag, str) or len(tag) > MAX_TAG or not tag.isprintable()):
        raise ApiError(422, "invalid_request",
                       f"'tag' must be a printable string of at most {MAX_TAG} characters")
    with document_errors("graph"):
        graph = identify(raw_graph)
    try:
        target = compiler.Target.from_json(raw_target)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ApiError(422, "invalid_target", f"invalid target: {exc}") from None
    sub = Submission(
        key=compiler.tuning_key(graph, target),
        graph_hash=compiler.graph_hash(graph),
        target=target.to_json(),
        queue_class=target.queue_class,
        wire=graph.canonical_text(),  # the text graph_hash hashed: no second copy of a large graph
        op_summary=dict(graph.op_summary()),
        num_nodes=len(graph.nodes),
        tag=tag,
    )
    return sub, graph


def validate_graph(graph: Any, cancel: threading.Event | None = None) -> Any:
    """Run a submission's graph (`read_submission`'s `WireIdentity`) on meta tensors: its
    ops must give the metas it declares. Returns the `compiler.Graph`; ApiError 422 naming
    what is wrong; setting `cancel` stops it (ApiError 400)."""
    with document_errors("graph"):
        return graph.validate(cancel)


@contextmanager
def document_errors(what: str) -> Iterator[None]:
    """What parsing or validating a client's `what` (graph, plan) raises, as the ApiError
    the client gets: 400 `cancelled` when it went away, else 422 `invalid_<what>`."""
    import compiler

    try:
        yield
    except compiler.ValidationCancelled:
        raise ApiError(400, "cancelled", "the client went away; validation stopped") from None
    except (ValueError, TypeError, KeyError, RecursionError, OverflowError) as exc:
        raise ApiError(422, f"invalid_{what}", f"invalid {what}: {exc}") from None
