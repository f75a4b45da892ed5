"""The answers of `GET /v1/schedules/{key}`, rendered once and reused for a short while.

Both ways a lookup is answered, the FastAPI route (routes/schedules.py) and the ASGI fast
path (fastpath.py), take their status, headers and body from here, so they answer byte for
byte alike. A settled answer (a schedule whose job is neither queued nor running: nothing
in progress will change it) is kept for `KILN_LOOKUP_CACHE_S` (default 1 s) and served
from memory; within that time an admin's invalidation or re-tune shows at once in the API
process that took it (`forget`) and in other processes when the kept answer expires.
Pending, unknown and failed keys are read from the database each time, so a new schedule
is never hidden by a kept answer. Concurrent reads of one key share one database read.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response

from service.context import HitBuffer
from service.errors import error_response
from service.hotpath import DatabaseUnavailable, ScheduleReader
from service.metrics import LOOKUPS
from service.store.lookup import Lookup

# \Z, not $: `$` also matches before a trailing newline, so "<64 hex>\n" would pass.
KEY_RE = re.compile(r"^[0-9a-f]{64}\Z")
MAX_KEPT = 10_000  # answers kept at once: bounded memory under a flood of distinct keys
_UNSETTLED = ("queued", "running")  # job states that will change a schedule's answer
_HIT = LOOKUPS.labels("hit")


@dataclass(frozen=True)
class Answer:
    """One rendered answer: what goes on the wire after the status line."""

    status: int
    headers: list[tuple[bytes, bytes]]  # as Starlette renders them; never mutated
    body: bytes

    @classmethod
    def of(cls, response: Response) -> Answer:
        return cls(response.status_code, list(response.raw_headers), bytes(response.body))

    @property
    def hit(self) -> bool:
        """A schedule was served (counted as a hit on its key)."""
        return self.status == 200

    def response(self) -> Response:
        """A fresh Starlette response with exactly these bytes, for the FastAPI route."""
        response = Response(self.body, self.status)
        response.raw_headers = list(self.headers)
        return response


INVALID_KEY = Answer.of(error_response(422, "invalid_key", "a key is 64 lowercase hex digits"))
DATABASE_DOWN = Answer.of(error_response(503, "database_unavailable",
                                         "the database is unavailable; retry shortly",
                                         {"Retry-After": "2"}))


def render(key: str, row: Lookup | None) -> Answer:
    """The answer for what the database holds for `key` (see docs/contracts.md)."""
    if row is None:
        return Answer.of(error_response(404, "not_found",
                                        f"no schedule for key {key}; submit the graph"))
    if row.status in ("heuristic", "tuned") and row.schedule:
        # The stored JSON is spliced in as is: no parse and re-encode. The job's state tells
        # a client whether a better schedule is coming (`job_status`).
        body = (f'{{"key":"{key}","status":"{row.status}",'
                f'"job_status":{json.dumps(row.job_status)},'
                f'"schedule":{row.schedule}}}')
        return Answer.of(Response(body, media_type="application/json"))
    if row.status == "invalidated":
        return Answer.of(error_response(404, "invalidated", f"the schedule for {key} was "
                                        "invalidated; submit again"))
    if row.status == "failed":
        return Answer.of(error_response(404, "failed",
                                        f"building a schedule for {key} failed: {row.error}"))
    return Answer.of(JSONResponse({"key": key, "status": "pending", "job_id": row.job_id,
                                   "job_status": row.job_status}, status_code=202))


class LookupAnswers:
    """Answers lookups: settled answers from memory, the rest from `reader`."""

    def __init__(self, reader: ScheduleReader, hits: HitBuffer, keep_s: float) -> None:
        self.reader, self.hits, self.keep_s = reader, hits, keep_s
        self._kept: dict[str, tuple[float, Answer]] = {}  # key -> (expiry, answer)
        self._reading: dict[str, asyncio.Future[Answer]] = {}  # reads under way, shared
        self._forgets = 0

    async def answer(self, key: str) -> Answer:
        """The answer for `key` (any string from the URL), counting a served schedule."""
        if not KEY_RE.match(key):
            return INVALID_KEY
        kept = self._kept.get(key)
        if kept is not None and kept[0] > time.monotonic():
            answer = kept[1]
        else:
            answer = await self._read(key)
        if answer.hit:
            self.hits.add(key)
            _HIT.inc()
        return answer

    def forget(self, key: str) -> None:
        """Drop a kept answer: the entry changed in this process (invalidation, re-tune)."""
        self._forgets += 1  # a read under way may have seen the old entry: not kept
        self._kept.pop(key, None)
        self._reading.pop(key, None)

    async def _read(self, key: str) -> Answer:
        loop = asyncio.get_running_loop()
        pending = self._reading.get(key)
        if pending is not None and pending.get_loop() is loop:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this request was cancelled
                # the request that was reading was cancelled: this one reads
        forgets = self._forgets
        future: asyncio.Future[Answer] = loop.create_future()
        self._reading[key] = future
        try:
            try:
                row = await self.reader.lookup(key)
            except DatabaseUnavailable:
                answer = DATABASE_DOWN
            else:
                answer = render(key, row)
                if self.keep_s > 0 and answer.hit and row is not None \
                        and row.job_status not in _UNSETTLED and forgets == self._forgets:
                    self._keep(key, answer)
            future.set_result(answer)
            return answer
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
            if self._reading.get(key) is future:
                del self._reading[key]

    def _keep(self, key: str, answer: Answer) -> None:
        now = time.monotonic()
        if len(self._kept) >= MAX_KEPT:
            self._kept = {k: v for k, v in self._kept.items() if v[0] > now}
            if len(self._kept) >= MAX_KEPT:
                self._kept.clear()
        self._kept[key] = (now + self.keep_s, answer)
