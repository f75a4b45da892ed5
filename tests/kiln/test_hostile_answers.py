"""Hostile service answers (issue 30, item 2): nested, huge, ill-typed, truncated. Every
one, on every route the client reads (plans, schedule lookups, submissions, jobs,
binaries), through a real local HTTP server, costs the training step one warning and its
local build; nothing raises out of `torch.compile`, nothing takes the job's memory."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import pytest

import kiln
from kiln import bounded_json, session
from kiln.cache import ScheduleCache
from kiln.client import JOB_STATUSES, MAX_ANSWER_BYTES, Answer, ServiceClient, ServiceError
from tests.kiln.fake_http import FakeServer, TricklingServer, json_reply
from tests.kiln.helpers import assert_close_losses, causes, train_mlp

KEY = "ab" * 32
JSON = {"Content-Type": "application/json"}
MB = 1 << 20

# Each a whole answer body, served with HTTP 200 for every request.
HOSTILE: dict[str, bytes] = {
    "100 KB of [": b"[" * 100_000,  # issue 30: RecursionError out of torch.compile
    "nested objects": b'{"a":' * 100_000,
    "nested within Python's limit": b"[" * 600 + b"]" * 600,
    "ten million empty lists": b"[" + b"[]," * (10 * MB) + b"[]]",
    "over the size cap": b'"' + b"a" * (MAX_ANSWER_BYTES + MB) + b'"',
    "a huge string field": json.dumps({"key": KEY, "status": "x" * (8 * MB)}).encode(),
    "truncated": b'{"key": "' + KEY.encode()[:20],
    "every field ill-typed": json.dumps({"key": [KEY], "status": {"tuned": 1}, "schedule": "s",
                                         "job_id": [1], "job_status": 5, "id": {},
                                         "binaries": "b", "format": 7}).encode(),
    "not UTF-8": b'{"key": "\xff\xfe"}',
    "bare NaN": b'{"key": NaN}',
}


@pytest.mark.usefixtures("kiln_state")
@pytest.mark.parametrize("lookups", [False, True], ids=["submitted", "looked up"])
@pytest.mark.parametrize("body", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_answer_on_every_route_costs_one_warning(body: bytes, lookups: bool,
                                                         kiln_warnings):
    """The plan's lookup meets the answer, then the schedule's (`lookups`), or else (a
    lookup answered 404, as by a service that starts empty) the submission and the polls."""
    with FakeServer(lambda method, path, _: (200, JSON, body), lookups=lookups,
                    plans=True) as srv:
        kiln.configure(url=srv.url, retries=0, request_timeout=5.0)
        want = train_mlp(steps=2, backend=None)
        start = time.monotonic()
        got = train_mlp(steps=2)
        took = time.monotonic() - start
        session.shutdown()  # the poller keeps asking; stop it before the server
    assert_close_losses(got, want)
    assert took < 90  # the local builds on the interpreter; the answers add seconds at most
    assert causes(kiln_warnings) == {"malformed": 1}
    paths = {path.split("/")[2] for _, path, _, _ in srv.requests}
    assert ({"plans", "schedules"} if lookups else {"plans", "graphs"}) <= paths


# ---- each field of each answer, each wrong type ------------------------------------------

WRONG = [None, True, 0, -1, 10**30, 1.5, "", "x" * 5000, [], ["x"], {}, {"x": 1}]
SCHEDULE = {"format": "kiln.schedule/1", "kernels": []}
GOOD_ANSWER = {"key": KEY, "status": "heuristic", "schedule": SCHEDULE, "job_id": "j1",
               "job_status": "running"}
GOOD_JOB = {"id": "j1", "status": "failed", "error": "boom"}


def _data(payload: bytes) -> dict[str, str]:
    return {"name": "k.cubin", "sha256": hashlib.sha256(payload).hexdigest(),
            "data": base64.b64encode(payload).decode()}


GOOD_BINARIES = {"binaries": [{"key": KEY, "source_hash": "c" * 64, "files": [_data(b"abc")]}],
                 "left_out": []}


def _variants(good: dict[str, Any]) -> list[tuple[str, Any]]:
    """`good` with one field (at any depth) replaced by each wrong value, or removed."""
    out: list[tuple[str, Any]] = []

    def walk(node: Any, path: tuple) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for name, value in list(items):
            for wrong in [*WRONG, "<missing>"]:
                copy = json.loads(json.dumps(good))
                parent = copy
                for step in path:
                    parent = parent[step]
                if wrong == "<missing>" and isinstance(parent, dict):
                    del parent[name]
                elif wrong != "<missing>":
                    parent[name] = wrong
                out.append((f"{'.'.join(map(str, (*path, name)))}={str(wrong)[:12]}", copy))
            if isinstance(value, dict | list):
                walk(value, (*path, name))

    walk(good, ())
    return out


def _fuzz(good: dict[str, Any], call: Any, check: Any) -> int:
    """Serve each variant of `good` to `call(client)`: it returns what `check` accepts or
    raises ServiceError, never anything else. Returns how many were refused."""
    variants = iter(_variants(good))
    current: list[Any] = []

    def handler(method: str, path: str, _: Any) -> Any:
        return json_reply(200, current[0])

    refused = 0
    with FakeServer(handler, lookups=True) as srv:
        client = ServiceClient(srv.url, connect_timeout=1, request_timeout=2, retries=0)
        for name, doc in variants:
            current[:] = [doc]
            try:
                result = call(client)
            except ServiceError as exc:
                assert exc.cause == "malformed", (name, exc)
                assert len(str(exc)) < 500, name  # no megabyte of answer in a warning
                refused += 1
            else:
                check(result)
    return refused


def test_every_field_of_a_schedule_answer_ill_typed_is_refused_or_harmless():
    def check(answer: Answer) -> None:
        assert answer.status in ("pending", "heuristic", "tuned", "failed")
        assert answer.schedule is None or isinstance(answer.schedule, dict)
        assert answer.job_id is None or (isinstance(answer.job_id, str) and len(answer.job_id) <= 128)
        assert answer.job_status is None or answer.job_status in JOB_STATUSES

    assert _fuzz(GOOD_ANSWER, lambda c: c.schedule(KEY), check) > 20
    assert _fuzz(GOOD_ANSWER, lambda c: c.submit({}, {}, KEY), check) > 20


def test_every_field_of_a_job_answer_ill_typed_is_refused_or_harmless():
    def check(job: Any) -> None:
        assert job.status in JOB_STATUSES
        assert job.error is None or (isinstance(job.error, str) and len(job.error) <= 1000)

    assert _fuzz(GOOD_JOB, lambda c: c.job("j1"), check) > 5


def test_every_field_of_a_binaries_answer_ill_typed_is_refused_or_harmless():
    def check(found: dict) -> None:
        for key, binary in found.items():
            assert key == KEY and binary.key == KEY and isinstance(binary.source_hash, str)
            for name, (digest, data) in binary.files.items():
                assert isinstance(name, str) and isinstance(digest, str)
                assert isinstance(data, bytes)

    assert _fuzz(GOOD_BINARIES, lambda c: c.binaries([KEY]), check) > 20


@pytest.mark.parametrize("data", [
    base64.b64encode(b"abcdef").decode()[:-3],  # truncated
    "!!!!",  # not base64
])
def test_a_truncated_binary_is_refused(data: str):
    doc = json.loads(json.dumps(GOOD_BINARIES))
    doc["binaries"][0]["files"][0]["data"] = data
    with FakeServer(lambda *_: json_reply(200, doc), lookups=True) as srv:
        with pytest.raises(ServiceError, match="malformed|binar") as info:
            ServiceClient(srv.url, retries=0).binaries([KEY])
    assert info.value.cause == "malformed"


def test_a_binary_whose_bytes_do_not_match_its_sha256_is_refused_before_use():
    from compiler import aot
    from kiln.binaries import refusal

    doc = json.loads(json.dumps(GOOD_BINARIES))
    doc["binaries"][0]["files"][0]["sha256"] = hashlib.sha256(b"other").hexdigest()
    with FakeServer(lambda *_: json_reply(200, doc), lookups=True) as srv:
        binary = ServiceClient(srv.url, retries=0).binaries([KEY])[KEY]
    job = aot.CompileJob("k_0", source="", source_hash="c" * 64, fn_name="k_0", spec="{}")
    assert "does not match its sha256" in refusal(job, KEY, binary)


def test_an_answer_declaring_more_than_the_cap_is_refused_before_it_is_read():
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (4 << 30))
    with TricklingServer(head, b"[" * 1000, interval=0.05) as srv:
        start = time.monotonic()
        with pytest.raises(ServiceError) as info:
            ServiceClient(srv.url, request_timeout=10, retries=0).schedule(KEY)
    assert info.value.cause == "malformed" and time.monotonic() - start < 2


def test_an_error_answers_message_is_cut_short():
    message = "m" * (4 * MB)
    reply = json_reply(418, {"error": {"code": "c" * 1000, "message": message}})
    with FakeServer(lambda *_: reply, lookups=True) as srv:
        with pytest.raises(ServiceError) as info:
            ServiceClient(srv.url, retries=0).schedule(KEY)
    assert len(str(info.value)) < 500


# ---- the local cache ---------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"[" * 100_000, b'{"a":' * 100_000,
                                     b"[" + b"[]," * (3 * MB) + b"[]]", b"\xff" * 100])
def test_a_hostile_cache_file_is_a_miss(tmp_path, content: bytes):
    cache = ScheduleCache(tmp_path)
    cache.path(KEY).parent.mkdir(parents=True)
    cache.path(KEY).write_bytes(content)
    assert cache.get(KEY) is None


def test_the_bounded_decoder_measures_depth_without_recursion():
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert bounded_json.nesting(deep, 10) == 11  # stopped past the bound
    assert bounded_json.nesting({"a": [1, {"b": []}]}, 10) == 4
    with pytest.raises(bounded_json.Refused, match="nested more than 4"):
        bounded_json.loads(b'[[[[[1]]]]]', max_bytes=100, max_depth=4)
    assert bounded_json.loads(b'[[[[1]]]]', max_bytes=100, max_depth=4) == [[[[1]]]]


def test_the_fuzzer_reaches_the_innermost_fields():
    names = {name.split("=")[0] for name, _ in _variants(GOOD_BINARIES)}
    assert {"binaries.0.files.0.data", "binaries.0.key", "left_out"} <= names
