"""Hostile clients over HTTP: every bad request gets a 4xx JSON error with a clear message,
never a 500; a schemathesis run over the OpenAPI spec finds no server error."""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from service.api.app import create_app
from service.context import ServiceContext
from tests.service.helpers import wire_body

# slow: each test starts the app, whose intake fork server imports torch and Triton (~4 s),
# and a schemathesis fuzz.
pytestmark = [pytest.mark.services, pytest.mark.slow]

ADMIN = {"Authorization": "Bearer admin-secret"}


def _mutated(path: list[Any], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(wire_body("mlp.train_bwd"))
    target = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return body


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_JSON = {
    "array body": [1, 2],
    "no graph": {"target": {}},
    "graph is a string": {"graph": "import os", "target": {}},
    "wrong format": _mutated(["graph", "format"], "kiln.graph/999"),
    "op outside the allowlist": _mutated(["graph", "nodes", 0, "op"], "builtins.eval"),
    "python source as op": _mutated(["graph", "nodes", 0, "op"], "__import__('os').system('x')"),
    "reference to an unknown node": _mutated(["graph", "outputs"], [{"ref": "nope"}]),
    "negative shape": _mutated(["graph", "inputs", 0, "shape"], [-4, 128]),
    "huge numel": _mutated(["graph", "inputs", 0, "shape"], [2**40, 2**40]),
    "rank 100": _mutated(["graph", "inputs", 0, "shape"], [1] * 100),
    "deeply nested argument": _mutated(["graph", "nodes", 0, "args"], [_deep(500)]),
    "unknown dtype": _mutated(["graph", "inputs", 0, "dtype"], "torch.quantum64"),
    "target without arch": _mutated(["target", "arch"], None),
    "target with a huge name": _mutated(["target", "name"], "x" * 100_000),
    "tag not a string": _mutated(["tag"], {"a": 1}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_hostile_json_bodies_get_a_clear_4xx(client: TestClient, name: str) -> None:
    r = client.post("/v1/graphs", content=json.dumps(HOSTILE_JSON[name]),
                    headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["code"] and len(error["message"]) > 10, error


@pytest.mark.parametrize("raw", [b"", b"{", b"\x80\x04\x95pickle", b"null", b"[" * 100_000,
                                 b'{"graph": NaN, "target": Infinity}', b"\xff\xfe\x00",
                                 b'{"graph": ' + b"9" * 5000 + b', "target": {}}',
                                 '{"graph": "\ud800"}'.encode("utf-8", "surrogatepass")])
def test_undecodable_bodies_get_422(client: TestClient, raw: bytes) -> None:
    r = client.post("/v1/graphs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["code"] in ("invalid_json", "invalid_request", "invalid_graph")


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_is_refused_and_never_run(client: TestClient, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for content_type, refused in (("application/json", 422), ("application/octet-stream", 415)):
        r = client.post("/v1/graphs", content=pickle.dumps(_Exploit(str(marker))),
                        headers={"content-type": content_type})
        assert r.status_code == refused
    assert not marker.exists()


def test_too_large_bodies_get_413(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_MAX_BODY_BYTES", "1000")
    body = json.dumps(wire_body()).encode()
    r = client.post("/v1/graphs", content=body + b" " * 70_000,
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the stream is counted as it comes
        for _ in range(100):
            yield b" " * 1000

    r = client.post("/v1/graphs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_values_the_database_cannot_store_are_422(client: TestClient) -> None:
    r = client.post("/v1/graphs", json=wire_body(tag="a\x00b"))  # refused before the database
    assert r.status_code == 422 and "printable" in r.json()["error"]["message"]
    for r in (client.get("/v1/admin/entries", params={"q": "ab\x00"}, headers=ADMIN),
              client.get("/v1/admin/entries", params={"tag": "\x00"}, headers=ADMIN)):
        assert r.status_code == 422 and "cannot be stored" in r.json()["error"]["message"]
    r = client.post("/v1/admin/entries/ab%00/invalidate", headers=ADMIN)
    assert r.status_code == 404


def test_malformed_authorization_is_401(client: TestClient) -> None:
    for header in ("Basic abc", "Bearer", "Bearer    ", "token"):
        r = client.get("/v1/admin/stats", headers={"Authorization": header})
        assert r.status_code == 401 and r.json()["error"]["message"]


def test_schemathesis_finds_no_server_error(pg_ctx: ServiceContext) -> None:
    """Valid and invalid examples generated from every operation of the OpenAPI spec, sent
    with an admin token (so admin routes are reached): none may answer 5xx."""
    # The schema and every call go to a loopback Host name (the app refuses any other).
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(ctx=pg_ctx),
                                            headers={"Host": "127.0.0.1"})
    operations = [result.ok() for result in schema.get_all_operations()]
    assert any(op.path == "/v1/graphs" for op in operations)
    exercised = 0
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=25, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: Any) -> None:
                case.call_and_validate(base_url="http://127.0.0.1", headers=ADMIN,
                                       checks=[not_a_server_error])

            try:
                check()
            except Unsatisfiable:  # an operation without inputs has no invalid form
                assert mode is GenerationMode.NEGATIVE
                continue
            exercised += 1
    assert exercised > len(operations)  # valid and invalid examples both ran
