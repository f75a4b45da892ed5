"""The HTTP client: answers validated, every failure a ServiceError with its cause,
bounded time, retries for connection errors and 5xx only."""

from __future__ import annotations

import json
import time

import pytest

from kiln.client import ServiceClient, ServiceError
from tests.kiln.fake_http import FakeServer, TricklingServer, json_reply
from tests.kiln.helpers import free_port

KEY = "ab" * 32
SCHEDULE = {"format": "kiln.schedule/1", "kernels": []}


def _client(url: str, **kw) -> ServiceClient:
    kw.setdefault("connect_timeout", 1.0)
    kw.setdefault("request_timeout", 1.0)
    kw.setdefault("retries", 1)
    return ServiceClient(url, token=kw.pop("token", None), **kw)


def test_submit_parses_tuned_and_pending_answers_and_sends_the_token():
    answers = iter([json_reply(200, {"key": KEY, "status": "tuned", "schedule": SCHEDULE,
                                     "job_id": 7}),
                    json_reply(202, {"key": KEY, "status": "pending", "job_id": "j1",
                                     "job_status": "running", "schedule": None})])
    def handler(method, path, body):
        return next(answers)

    with FakeServer(handler, lookups=True) as srv:
        client = _client(srv.url, token="secret")
        tuned = client.submit({"g": 1}, {"t": 1}, KEY, tag="mlp")
        pending = client.submit({"g": 1}, {"t": 1}, KEY)
    assert tuned.status == "tuned" and tuned.schedule == SCHEDULE and tuned.job_id == "7"
    assert tuned.job_status is None  # a service that does not say
    assert pending.status == "pending" and pending.schedule is None and pending.job_id == "j1"
    assert pending.job_status == "running"
    method, path, body, headers = srv.requests[0]
    assert (method, path) == ("POST", "/v1/graphs")
    assert body == {"graph": {"g": 1}, "target": {"t": 1}, "tag": "mlp"}
    assert headers["Authorization"] == "Bearer secret"


def test_a_graph_given_as_json_text_is_sent_as_that_document():
    def handler(method, path, body):
        return json_reply(202, {"key": KEY, "status": "pending", "job_id": "j", "schedule": None})

    with FakeServer(handler, lookups=True) as srv:
        client = _client(srv.url)
        client.submit('{"g":[1,{"h":"x"}]}', {"t": 1}, KEY, tag="mlp")
        client.submit('{"g":2}', {"t": 1}, KEY)
    assert srv.requests[0][2] == {"graph": {"g": [1, {"h": "x"}]}, "target": {"t": 1}, "tag": "mlp"}
    assert srv.requests[1][2] == {"graph": {"g": 2}, "target": {"t": 1}}


def test_schedule_404_is_unknown_and_job_is_parsed():
    def handler(method, path, body):
        if path.startswith("/v1/schedules/"):
            return json_reply(404, {"error": {"code": "not_found", "message": "no"}})
        return json_reply(200, {"id": "j", "key": KEY, "status": "failed", "error": "boom"})

    with FakeServer(handler, lookups=True) as srv:
        client = _client(srv.url)
        assert client.schedule(KEY).status == "unknown"
        job = client.job("j")
    assert job.status == "failed" and job.error == "boom"


def test_an_exchange_runs_with_a_short_switch_interval_then_restores_it():
    """Beside kiln's compiling threads each receive would wait up to the default 5 ms for
    the GIL (compiler/runtime/gil.py); the in-process server sees the interval the client
    set for the exchange, a failed exchange restores it too."""
    import sys

    from compiler.runtime.gil import SHORT_SWITCH_INTERVAL

    during = []

    def handler(method, path, body):
        during.append(sys.getswitchinterval())
        if path.startswith("/v1/jobs/"):
            return json_reply(500, {"error": {"code": "boom", "message": "x"}})
        return json_reply(404, {"error": {"code": "not_found", "message": "no"}})

    before = sys.getswitchinterval()
    with FakeServer(handler, lookups=True) as srv:
        client = _client(srv.url, retries=0)
        assert client.schedule(KEY).status == "unknown"
        with pytest.raises(ServiceError):
            client.job("j")
    assert during == [pytest.approx(min(before, SHORT_SWITCH_INTERVAL), rel=0.05)] * 2
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        ((200, {}, b"<html>not json</html>"), "malformed"),
        (json_reply(200, ["a", "list"]), "malformed"),
        (json_reply(200, {"key": "cd" * 32, "status": "tuned", "schedule": SCHEDULE}),
         "malformed"),
        (json_reply(200, {"key": KEY, "status": "tuned"}), "malformed"),
        (json_reply(200, {"key": KEY, "status": "weird", "schedule": SCHEDULE}), "malformed"),
        (json_reply(202, {"key": KEY, "status": "heuristic", "schedule": SCHEDULE,
                          "job_status": "asleep"}), "malformed"),
        (json_reply(418, {"error": {"code": "teapot", "message": "no"}}), "malformed"),
        (json_reply(422, {"error": {"code": "bad_graph", "message": "node n3"}}), "rejected"),
        (json_reply(401, {"error": {"code": "auth", "message": "token"}}), "auth"),
        (json_reply(500, {"error": {"code": "boom", "message": "x"}}), "server_error"),
        ((0, {}, b""), "unreachable"),  # connection closed without an answer
    ],
)
def test_bad_answers_raise_service_error_with_their_cause(reply, cause):
    with FakeServer(lambda m, p, b: reply, lookups=True) as srv:
        with pytest.raises(ServiceError) as info:
            _client(srv.url, retries=0).submit({}, {}, KEY)
    assert info.value.cause == cause


def test_connection_refused_is_unreachable_and_retried_within_the_deadline():
    client = _client(f"http://127.0.0.1:{free_port()}", retries=2)
    start = time.monotonic()
    with pytest.raises(ServiceError) as info:
        client.schedule(KEY)
    assert info.value.cause == "unreachable"
    assert time.monotonic() - start < 3.0


def test_5xx_is_retried_then_succeeds():
    replies = iter([json_reply(503, {}), json_reply(200, {"key": KEY, "status": "heuristic",
                                                          "schedule": SCHEDULE})])
    with FakeServer(lambda m, p, b: next(replies), lookups=True) as srv:
        answer = _client(srv.url, retries=2).schedule(KEY)
    assert answer.status == "heuristic" and len(srv.requests) == 2


def test_a_hanging_server_times_out_without_hanging_the_client():
    def handler(method, path, body):
        time.sleep(3)
        return json_reply(200, {})

    with FakeServer(handler, lookups=True) as srv:
        client = _client(srv.url, request_timeout=0.3, retries=2)
        start = time.monotonic()
        with pytest.raises(ServiceError) as info:
            client.schedule(KEY)
        elapsed = time.monotonic() - start
    assert info.value.cause == "timeout"
    assert elapsed < 1.5  # timeouts are not retried: no hang beyond the configured bound


_BODY = json.dumps({"key": KEY, "status": "heuristic", "schedule": SCHEDULE}).encode()
_HEAD = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
         f"Content-Length: {len(_BODY)}\r\n\r\n").encode()


@pytest.mark.parametrize("slow_part", ["headers", "body"])
def test_a_trickling_server_is_cut_at_the_exchange_deadline(slow_part):
    # One byte every 0.1 s: never silent for as long as a socket timeout, never done. The
    # deadline covers the whole exchange, status line and headers as much as the body.
    prefix, trickle = (b"", _HEAD + _BODY) if slow_part == "headers" else (_HEAD, _BODY)
    with TricklingServer(prefix, trickle, interval=0.1) as srv:
        client = _client(srv.url, request_timeout=1.0, retries=2)
        start = time.monotonic()
        with pytest.raises(ServiceError) as info:
            client.schedule(KEY)
        elapsed = time.monotonic() - start
    assert info.value.cause == "timeout"
    assert 0.9 < elapsed < 1.5  # one exchange's deadline; a timeout is not retried
    assert 0 < srv.served < len(trickle)


def test_url_must_be_http():
    with pytest.raises(ValueError, match="http"):
        ServiceClient("ftp://example.org")
