"""Turn a `POST /v1/graphs` body into a validated submission, or a clear 4xx error."""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import ClientDisconnect, Request

from service.errors import ApiError
from service.store import Submission

log = logging.getLogger(__name__)
MAX_TAG = 200


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything over `limit` bytes before reading it all."""
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
        raise ApiError(400, "bad_request", "the client disconnected before sending the body") from None
    return b"".join(chunks)


def _field(obj: dict[str, Any], name: str) -> Any:
    if name not in obj:
        raise ApiError(422, "invalid_request", f"the body has no '{name}' field; send "
                       '{"graph": <kiln.graph/1>, "target": <target>}')
    return obj[name]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f'bare {name} is not JSON; write non-finite floats as {{"float": "nan"|"inf"|"-inf"}}')


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A repeated key would let a proxy or a log see one value and kiln use another.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"the key {key[:40]!r} repeats in one object")
        obj[key] = value
    return obj


def parse_submission(body: bytes) -> tuple[Submission, Any]:
    """Validate a submission body; returns the Submission and the parsed compiler.Graph.
    Every problem a client can cause becomes an ApiError 422 naming what is wrong."""
    import compiler

    try:
        obj = json.loads(body, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise ApiError(422, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_request", "the body must be a JSON object")
    raw_graph, raw_target = _field(obj, "graph"), _field(obj, "target")
    tag = obj.get("tag")
    # printable: no line breaks, terminal escapes or bidi overrides to spoof pages and logs
    if tag is not None and (not isinstance(tag, str) or len(tag) > MAX_TAG or not tag.isprintable()):
        raise ApiError(422, "invalid_request",
                       f"'tag' must be a printable string of at most {MAX_TAG} characters")
    try:
        graph = compiler.from_wire(raw_graph)
    except (ValueError, TypeError, KeyError, RecursionError, OverflowError) as exc:
        raise ApiError(422, "invalid_graph", f"invalid graph: {exc}") from None
    try:
        target = compiler.Target.from_json(raw_target)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ApiError(422, "invalid_target", f"invalid target: {exc}") from None
    wire = graph.to_json()
    sub = Submission(
        key=compiler.tuning_key(graph, target),
        graph_hash=compiler.graph_hash(graph),
        target=target.to_json(),
        queue_class=target.queue_class,
        wire=json.dumps(wire, sort_keys=True, separators=(",", ":")),
        op_summary=dict(graph.op_summary()),
        num_nodes=len(wire.get("nodes", ())),
        tag=tag,
    )
    return sub, graph
