"""`/docs` works offline (its scripts come from this server), and the OpenAPI description
names the bearer scheme and describes real answers."""

from __future__ import annotations

import re

import pytest

from service.api.openapi import JobAnswer, ScheduleAnswer
from tests.service.helpers import fake_submission

# slow: each test starts the app, whose intake fork server imports torch and Triton (~4 s).
pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_docs_load_nothing_from_another_host(client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/") for s in sources), sources
    for path in sources:
        assert client.get(path).status_code == 200, path
    assert "cdn" not in page.text.lower()
    assert client.get("/redoc").status_code == 404  # ReDoc would need a CDN


def test_openapi_has_security_schemes_and_response_schemas(client) -> None:
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    get_schedule = schema["paths"]["/v1/schedules/{key}"]["get"]
    assert get_schedule["security"] == [{"bearer": []}, {}]
    assert schema["paths"]["/v1/admin/stats"]["get"]["security"] == [{"bearer": []}]
    ok = get_schedule["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/ScheduleAnswer"}
    missing = get_schedule["responses"]["404"]["content"]["application/json"]["schema"]
    assert missing == {"$ref": "#/components/schemas/ErrorAnswer"}
    for path, methods in schema["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in methods.items():
            for status, answer in op.get("responses", {}).items():
                body = answer.get("content", {}).get("application/json", {}).get("schema")
                assert body != {}, (path, method, status)  # no empty schemas


def test_real_answers_match_the_documented_models(client, pg_ctx) -> None:
    from service import store

    sub = fake_submission()
    with pg_ctx.transaction() as session:
        _entry, job, _ = store.submit(session, sub)
    pending = client.get(f"/v1/schedules/{sub.key}")
    assert pending.status_code == 202
    ScheduleAnswer.model_validate(pending.json())
    JobAnswer.model_validate(client.get(f"/v1/jobs/{job.id}").json())
