"""The `/admin` dashboard: server-rendered pages over `service.store.admin`.

Every page needs an admin session (its id in the `kiln_admin` cookie set at login); without it
a page redirects to the login form and shows no data. Actions are POST forms with a CSRF
token bound to the session (service/dashboard/security.py) and a confirmation step.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from service.api.routes.schedules import KEY_RE
from service.auth import SESSION_TTL_S
from service.dashboard import deps, security, views
from service.dashboard.highlight import stylesheet
from service.store import admin, plans
from service.tenants import check_tenant

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
_STATIC = {name: _HERE / "static" / name for name in ("dashboard.css", "dashboard.js")}
_MEDIA = {".css": "text/css", ".js": "text/javascript"}
_KEY_CHARS = frozenset("0123456789abcdef")
JOB_STATUSES = ("queued", "running", "done", "failed")
PLANS_SHOWN = 1000  # the newest; the admin API pages through the rest

templates = Jinja2Templates(directory=str(_HERE / "templates"))
templates.env.globals.update(
    fmt_ms=views.ms, fmt_seconds=views.seconds, fmt_age=views.age, fmt_speedup=views.speedup,
    job_duration=views.job_duration,
    static=lambda name: f"/admin/static/{name}",
)

router = APIRouter(prefix="/admin", include_in_schema=False)


def _login_redirect(request: Request, target: str | None = None) -> RedirectResponse:
    if target is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/admin/login?next={quote(target, safe='')}", status_code=303)


def _is_admin(request: Request, session: Session) -> bool:
    sid = security.session_id(request)
    return sid is not None and deps.is_admin_session(request, session, sid)


def _logged_in(request: Request) -> bool:
    with deps.transaction(request) as session:
        return _is_admin(request, session)


def _render(request: Request, name: str, context: dict[str, Any], status: int = 200,
            logged_in: bool = True) -> HTMLResponse:
    csrf = security.csrf_token(request)
    response = templates.TemplateResponse(
        request, name, {"csrf": csrf, "logged_in": logged_in, **context}, status_code=status)
    response.headers.update(security.PAGE_HEADERS)
    security.ensure_csrf_cookie(response, request)
    return response


def _valid_key(key: str) -> bool:
    return KEY_RE.match(key) is not None


def _no_entry(request: Request, key: str) -> HTMLResponse:
    return _render(request, "error.html", {"heading": "No such entry", "message":
                   f"No cache entry has the key {key[:64]}."}, status=404)


# --- login ---------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str | None = None) -> Response:
    """The login form; a browser that is already logged in goes straight to the dashboard."""
    if _logged_in(request):
        return RedirectResponse(security.safe_next(next), status_code=303)
    return _render(request, "login.html", {"next": security.safe_next(next), "error": None},
                   logged_in=False)


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, token: Annotated[str, Form()] = "",
          csrf_token: Annotated[str, Form()] = "", next: Annotated[str, Form()] = "") -> Response:
    """Check the admin token; on success keep it in the HttpOnly session cookie."""
    target = security.safe_next(next)
    if not security.csrf_valid(request, csrf_token):
        return _render(request, "login.html", {"next": target, "error":
                       "The form expired; please log in again."}, status=403, logged_in=False)
    address = request.client.host if request.client else "unknown"
    token = token.strip()
    # A token refused again and again is not even checked for a while; any other is, and
    # the right one logs in whatever else came from this address.
    wait = deps.token_blocked_for(request, token)
    sid = None
    if not wait and token and len(token) <= 512:
        with deps.transaction(request) as session:
            if deps.is_admin_token(request, session, token):
                sid = deps.open_session(request, session, token)
    if sid is None and not wait:
        wait = deps.login_failed(request, token, address)
        log.info("dashboard login refused from %s", address)
    if sid is None and wait:
        response = _render(request, "login.html", {"next": target, "error":
                           f"Too many failed logins; try again in {wait:.0f} s."},
                           status=429, logged_in=False)
        response.headers["Retry-After"] = str(max(1, round(wait)))
        return response
    if sid is None:
        return _render(request, "login.html", {"next": target, "error":
                       "That is not an admin token."}, status=401, logged_in=False)
    response = RedirectResponse(target, status_code=303)
    security.set_session_cookie(response, request, sid, SESSION_TTL_S)
    return response


@router.post("/logout")
def logout(request: Request, csrf_token: Annotated[str, Form()] = "") -> Response:
    """End the session on the server and forget its cookie (CSRF-checked, so no other site
    can log the operator out)."""
    if not security.csrf_valid(request, csrf_token):
        return _render(request, "error.html", {"heading": "Form expired", "message":
                       "The form's security token did not match; reload the page and try "
                       "again."}, status=403, logged_in=False)
    sid = security.session_id(request)
    if sid is not None:
        with deps.transaction(request) as session:
            deps.close_session(session, sid)
    response = RedirectResponse("/admin/login", status_code=303)
    security.clear_session_cookie(response, request)
    return response


@router.get("/static/{name}")
def static(name: str) -> Response:
    """The dashboard's CSS and JS (no data; served without login). Pygments CSS is appended."""
    path = _STATIC.get(name)
    if path is None:
        raise HTTPException(404, "no such file")
    if name == "dashboard.css":
        body = path.read_text(encoding="utf-8") + "\n" + stylesheet()
        return Response(body, media_type="text/css", headers={"Cache-Control": "max-age=300"})
    return FileResponse(path, media_type=_MEDIA[path.suffix],
                        headers={"Cache-Control": "max-age=300"})


# --- pages ---------------------------------------------------------------------------


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def overview(request: Request) -> Response:
    """Entries by status, hit rate over time, misses by reason, queues and workers."""
    with deps.transaction(request) as session:
        if not _is_admin(request, session):
            return _login_redirect(request)
        stats = admin.stats(session, deps.queue_depth(request))
    live_within_s = max(3 * request.app.state.settings.heartbeat_s, 15.0)  # as /metrics counts
    return _render(request, "overview.html", {"nav": "overview",
                                              **views.overview_context(stats, live_within_s)})


@router.get("/entries", response_class=HTMLResponse)
def entries(request: Request, q: str | None = None,
            target: str | None = None, status: str | None = None, tag: str | None = None,
            sort: str = "last_used", order: str = "desc", page: int = 1,
            per_page: int = 50) -> Response:
    """Searchable, filterable, sortable, paged table of cache entries."""
    if not _logged_in(request):
        return _login_redirect(request)
    filters = {
        "q": (q or "").strip().lower()[:64] or None,
        "target": (target or "").strip()[:128] or None,
        "status": status if status in views.STATUSES else None,
        "tag": (tag or "").strip()[:200] or None,
        "sort": sort if sort in views.SORTS else "last_used",
        "order": "asc" if order == "asc" else "desc",
    }
    notice = None
    if filters["q"] and not set(filters["q"]) <= _KEY_CHARS:
        notice, filters["q"] = "Search takes a hexadecimal key or graph-hash prefix.", None
    with deps.transaction(request) as session:
        result = admin.list_entries(session, page=min(max(page, 1), 1_000_000),
                                      per_page=min(max(per_page, 10), 200), **filters)
    pages = max(1, math.ceil(result["total"] / max(result["per_page"], 1)))
    query = {k: v for k, v in filters.items() if v}
    if result["per_page"] != 50:
        query["per_page"] = result["per_page"]

    def page_url(number: int) -> str:
        return "/admin/entries?" + urlencode({**query, "page": number})

    return _render(request, "entries.html", {
        "nav": "entries", "result": result, "pages": pages, "f": filters, "notice": notice,
        "statuses": views.STATUSES, "sorts": views.SORTS, "page_url": page_url})


@router.get("/entries/{key}", response_class=HTMLResponse)
def entry(request: Request, key: str, done: str | None = None) -> Response:
    """One entry: key components, ops, kernels with source and candidate plots, jobs."""
    with deps.transaction(request) as session:
        if not _is_admin(request, session):
            return _login_redirect(request)
        detail = admin.entry_detail(session, key) if _valid_key(key) else None
        # Entries of the same graph for other targets: why a lookup of this graph missed.
        siblings = admin.list_entries(session, q=detail["graph_hash"], per_page=100,
                                              sort="created")["items"] if detail else []
    if detail is None:
        return _no_entry(request, key)
    notice = {"invalidate": "Entry invalidated: clients will miss and rebuild it.",
              "retune": "Re-tune queued."}.get(done or "")
    return _render(request, "entry.html", {"nav": "entries", "notice": notice,
                                           **views.entry_context(detail, siblings)})


@router.get("/jobs", response_class=HTMLResponse)
def jobs(request: Request, status: str | None = None) -> Response:
    """Running jobs first, then recent ones, with progress, attempts and errors."""
    wanted = status if status in JOB_STATUSES else None
    with deps.transaction(request) as session:
        if not _is_admin(request, session):
            return _login_redirect(request)
        running = admin.list_jobs(session, status="running", limit=100)["items"] \
            if wanted in (None, "running") else []
        recent = [j for j in admin.list_jobs(session, status=wanted, limit=100)["items"]
                  if j.get("status") != "running"]
    return _render(request, "jobs.html", {"nav": "jobs", "running": running, "recent": recent,
                                          "status": wanted, "job_statuses": JOB_STATUSES})


@router.get("/plans", response_class=HTMLResponse)
def plans_page(request: Request, done: str | None = None) -> Response:
    """Stored plans by tenant (the published ones first), each with a Publish-to-all form."""
    with deps.transaction(request) as session:
        if not _is_admin(request, session):
            return _login_redirect(request)
        items = plans.list_plans(session, limit=PLANS_SHOWN)
    notice = "Plan published to every tenant." if done == "publish" else None
    return _render(request, "plans.html", {"nav": "plans", "notice": notice,
                                           "groups": views.plans_by_tenant(items)})


# --- actions -------------------------------------------------------------------------

_EXPLAIN = {
    "invalidate": "Clients asking for this key get 404 `invalidated` and fall back to a local "
                  "build; the next submission of the graph creates a new job.",
    "retune": "A new tuning job is queued for this key; the current schedule keeps serving "
              "until the new one lands.",
}


def _action(request: Request, key: str, action: str, csrf_token: str,
            confirmed: str) -> Response:
    with deps.transaction(request) as session:
        if not _is_admin(request, session):
            return _login_redirect(request, "/admin/entries" + (f"/{key}" if _valid_key(key)
                                                                 else ""))
        if not _valid_key(key):
            return _no_entry(request, key)
        if not security.csrf_valid(request, csrf_token):
            return _render(request, "error.html", {"heading": "Form expired", "message":
                           "The form's security token did not match; reload the page and "
                           "try again."}, status=403)
        if confirmed != "yes":
            return _render(request, "confirm.html", {
                "action": action, "subject": "entry", "key": key, "explanation": _EXPLAIN[action],
                "post_to": f"/admin/entries/{key}/{action}", "back_to": f"/admin/entries/{key}",
                "fields": {}})
        done = _ACTIONS[action](session, key)
    if done is None:
        return _no_entry(request, key)
    request.app.state.lookups.forget(key)  # as the API's admin routes: a kept answer is stale
    log.info("dashboard: %s %s", action, key)
    return RedirectResponse(f"/admin/entries/{key}?done={action}", status_code=303)


_ACTIONS = {"invalidate": admin.invalidate, "retune": admin.retune}


@router.post("/entries/{key}/invalidate")
def invalidate(request: Request, key: str,
               csrf_token: Annotated[str, Form()] = "",
               confirmed: Annotated[str, Form()] = "") -> Response:
    """Invalidate an entry (after confirmation)."""
    return _action(request, key, "invalidate", csrf_token, confirmed)


@router.post("/plans/{key}/publish")
def publish_plan(request: Request, key: str,
                 csrf_token: Annotated[str, Form()] = "", tenant: Annotated[str, Form()] = "",
                 confirmed: Annotated[str, Form()] = "") -> Response:
    """Publish a tenant's plan to every tenant (after confirmation), as
    `POST /v1/admin/plans/{key}/publish` does."""
    with deps.transaction(request) as session:
        if not _is_admin(request, session):
            return _login_redirect(request, "/admin/plans")
        try:
            name = check_tenant(tenant)
        except ValueError as exc:
            return _render(request, "error.html", {"heading": "No such tenant",
                                                   "message": str(exc)}, status=422)
        if not _valid_key(key):
            return _no_plan(request, key, name)
        if not security.csrf_valid(request, csrf_token):
            return _render(request, "error.html", {"heading": "Form expired", "message":
                           "The form's security token did not match; reload the page and "
                           "try again."}, status=403)
        if confirmed != "yes":
            return _render(request, "confirm.html", {
                "action": "publish", "subject": "plan", "key": key,
                "explanation": f"Tenant {name}'s plan for this key will run in every "
                               "tenant's jobs that have no plan of their own for it.",
                "post_to": f"/admin/plans/{key}/publish", "back_to": "/admin/plans",
                "fields": {"tenant": name}})
        try:
            published = plans.publish_plan(session, key, name)
        except ValueError as exc:
            return _render(request, "error.html", {"heading": "Already published",
                                                   "message": str(exc)}, status=409)
    if published is None:
        return _no_plan(request, key, name)
    log.info("dashboard: published plan %s of tenant %s", key, name)
    return RedirectResponse("/admin/plans?done=publish", status_code=303)


def _no_plan(request: Request, key: str, tenant: str) -> HTMLResponse:
    return _render(request, "error.html", {"heading": "No such plan", "message":
                   f"Tenant {tenant} holds no plan with the key {key[:64]}."}, status=404)


@router.post("/entries/{key}/retune")
def retune(request: Request, key: str,
           csrf_token: Annotated[str, Form()] = "",
           confirmed: Annotated[str, Form()] = "") -> Response:
    """Queue a re-tune of an entry (after confirmation)."""
    return _action(request, key, "retune", csrf_token, confirmed)
