"""The API's own description: bearer-token security, response schemas for the client
endpoints, and `/docs` served from the installed Swagger UI files (no CDN: it renders on a
machine without internet access).

The routes return plain dicts (the hot path splices stored JSON); the models here document
those answers, and tests/service/test_openapi.py checks real answers against them.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

DOCS_STATIC = "/docs/static"


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. `not_found`")
    message: str = Field(description="one sentence: what happened and what to do")


class ErrorAnswer(BaseModel):
    """Every 4xx/5xx answer."""

    error: ErrorDetail


JobStatus = Literal["queued", "running", "done", "failed"]


class ScheduleAnswer(BaseModel):
    """`GET /v1/schedules/{key}` with status 200 (`schedule` set) or 202 (`job_id` set), and
    `POST /v1/graphs`."""

    key: str = Field(pattern="^[0-9a-f]{64}$")
    status: Literal["pending", "heuristic", "tuned", "failed"]
    schedule: dict[str, Any] | None = Field(None, description="a kiln.schedule/1 document")
    job_id: int | None = None
    job_status: JobStatus | None = Field(
        None, description="the job's state, read with the schedule (`done`: no tuner will "
                          "improve it); null when the key has no job")


class JobEvent(BaseModel):
    status: str
    at: str
    worker: str | None = None
    message: str | None = None


class JobAnswer(BaseModel):
    """`GET /v1/jobs/{id}`."""

    id: int
    key: str
    status: JobStatus
    stage: str
    progress: float | None = None
    attempts: int
    error: str | None = None
    worker: str | None = None
    tuned_device: str | None = None  # the GPU the tuning child reported (`cuda:N`)
    created_at: str
    finished_at: str | None = None
    history: list[JobEvent]


class PlanStored(BaseModel):
    """`PUT /v1/plans/{key}`: 201 when stored, 200 when the caller's tenant already held a
    plan for the key (kept)."""

    key: str = Field(pattern="^[0-9a-f]{64}$")
    created: bool


# (path, method) -> {status: model}; 4xx/5xx of every /v1 route get ErrorAnswer.
RESPONSES: dict[tuple[str, str], dict[str, type[BaseModel]]] = {
    ("/v1/graphs", "post"): {"200": ScheduleAnswer, "202": ScheduleAnswer},
    ("/v1/schedules/{key}", "get"): {"200": ScheduleAnswer, "202": ScheduleAnswer},
    ("/v1/jobs/{job_id}", "get"): {"200": JobAnswer},
    ("/v1/admin/entries/{key}/retune", "post"): {"202": JobAnswer},
    ("/v1/plans/{key}", "put"): {"200": PlanStored, "201": PlanStored},
}

SECURITY_SCHEMES = {"bearer": {
    "type": "http", "scheme": "bearer",
    "description": "An API token (`kiln token create --role client|admin`). On a loopback "
                   "address the client endpoints need none; admin endpoints always do."}}


def _schema(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    components = schema.setdefault("components", {})
    components["securitySchemes"] = SECURITY_SCHEMES
    models = components.setdefault("schemas", {})
    for model in (ErrorAnswer, ScheduleAnswer, JobAnswer, PlanStored):
        definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
        models.update(definition.pop("$defs", {}))
        models[model.__name__] = definition
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            if not path.startswith("/v1/"):
                continue
            # Bearer token; `{}` says a call without one can be fine (loopback, client routes).
            operation["security"] = [{"bearer": []}] if path.startswith("/v1/admin/") else \
                [{"bearer": []}, {}]
            known = RESPONSES.get((path, method), {})
            for status, answer in operation.get("responses", {}).items():
                model = known.get(status) or (ErrorAnswer if status[0] in "45" else None)
                if model is not None:
                    answer["content"] = {"application/json": {
                        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
                elif answer.get("content", {}).get("application/json", {}).get("schema") == {}:
                    answer["content"]["application/json"]["schema"] = {
                        "type": "object", "description": "see docs/contracts.md (Admin API)"}
    app.openapi_schema = schema
    return schema


def install_docs(app: FastAPI) -> None:
    """OpenAPI with security schemes and response schemas; Swagger UI at `/docs` from the
    `swagger-ui-bundle` package's files. Build the app with `docs_url=None, redoc_url=None`."""
    from swagger_ui_bundle import swagger_ui_path

    app.openapi = lambda: _schema(app)  # type: ignore[method-assign]
    app.mount(DOCS_STATIC, StaticFiles(directory=swagger_ui_path), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_STATIC}/favicon-32x32.png")
