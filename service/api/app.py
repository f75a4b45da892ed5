"""The FastAPI application: routes, error handlers, middleware, background upkeep."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from service import forkserver
from service.api.deps import TokenRoles
from service.api.fastpath import LookupFastPath
from service.api.limits import BodyDeadlineMiddleware
from service.api.lookup_answers import LookupAnswers
from service.api.loopback import BrowserGuardMiddleware
from service.api.openapi import install_docs
from service.api.private_docs import PrivateDocsMiddleware
from service.api.routes import admin, binaries, graphs, health, jobs, plans, schedules
from service.auth import admin_token_weakness
from service.context import HitBuffer, ServiceContext
from service.errors import install_error_handlers
from service.hotpath import ScheduleReader
from service.intake import warm_intake
from service.metrics import MetricsMiddleware
from service.ratelimit import make_limiters
from service.settings import Settings

log = logging.getLogger(__name__)
WORKER_SWITCH_INTERVAL_S = 0.001  # with workers in the API process (see _start_workers)


def _upkeep(app: FastAPI, stop: threading.Event) -> None:
    """Flush hit counters every second; re-enqueue lost work every lease period."""
    ctx: ServiceContext = app.state.ctx
    ticks = 0
    while not stop.wait(1.0):
        app.state.hits.flush(ctx)
        ticks += 1
        if ticks % max(1, int(ctx.settings.lease_s)) == 0:
            try:
                ctx.recover()
            except Exception as exc:  # Redis or the database down: try again next period
                log.warning("recovery pass failed: %s", exc)
    app.state.hits.flush(ctx)


def create_app(settings: Settings | None = None, ctx: ServiceContext | None = None,
               embedded_worker: bool = False, gpu_devices: Sequence[str] = ()) -> FastAPI:
    """Build the API. With `embedded_worker`, a CPU worker thread runs in this process (the
    embedded default of `kiln serve`); each of `gpu_devices` (`cuda:N`) gets a tuning worker
    thread, which times candidates in a spawned child of its own (tuner.runner).
    Migrations are not run here: `kiln db upgrade` is its own step."""
    ctx = ctx or ServiceContext(settings or Settings.from_env())
    _refuse_weak_admin_token(ctx.settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        try:
            ctx.recover()
        except Exception as exc:
            log.warning("initial recovery pass failed: %s", exc)
        try:  # before the first request: none of them waits on the imports
            await run_in_threadpool(warm_intake, ctx.settings)
            app.state.validation_warm = True
        except Exception as exc:  # noqa: BLE001 - the first submission pays instead
            log.warning("warming graph validation failed: %s", exc)
        upkeep = threading.Thread(target=_upkeep, args=(app, stop), name="kiln-upkeep", daemon=True)
        upkeep.start()
        workers = _start_workers(ctx, embedded_worker, gpu_devices)
        try:
            yield
        finally:
            stop.set()
            for worker in workers:
                worker.stop()
            for worker in workers:
                worker.join(timeout=30)
            forkserver.shutdown()  # the fork servers of intake and the embedded worker, if started
            upkeep.join(timeout=10)
            await app.state.reader.close()

    app = FastAPI(title="kiln", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Remote torch.compile backend: schedules for aten graphs.")
    app.state.ctx = ctx
    # The dashboard reads these three (service/dashboard/deps.py).
    app.state.settings, app.state.sessionmaker, app.state.queue = ctx.settings, ctx.sessions, ctx.queue
    app.state.hits = HitBuffer()
    # In Redis when configured, so every API process shares them; the throttle covers bearer
    # tokens and dashboard logins.
    app.state.limiter, app.state.auth_failures = make_limiters(ctx.settings)
    app.state.token_roles = TokenRoles(ctx.settings.token_cache_s)
    app.state.reader = ScheduleReader(ctx)
    app.state.lookups = LookupAnswers(app.state.reader, app.state.hits, ctx.settings.lookup_cache_s)
    install_error_handlers(app)
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(BodyDeadlineMiddleware, total_s=ctx.settings.body_timeout_s, idle_s=ctx.settings.body_idle_s)
    app.add_middleware(PrivateDocsMiddleware, loopback=ctx.settings.loopback)
    # Schedule lookups are answered here, after the browser checks and before the rest.
    app.add_middleware(LookupFastPath)
    # Added last, so it runs first: refused requests never reach a route or read a body.
    app.add_middleware(BrowserGuardMiddleware, loopback=ctx.settings.loopback)
    for module in (graphs, schedules, binaries, plans, jobs, admin, health):
        app.include_router(module.router)
    install_docs(app)  # /docs without a CDN, security schemes and response schemas
    _mount_dashboard(app)
    return app


def _start_workers(ctx: ServiceContext, cpu: bool, gpu_devices: Sequence[str]) -> list:
    """The in-process workers: the CPU build worker, then one tuning worker per GPU."""
    from service.worker import Worker

    devices = (["cpu"] if cpu else []) + list(gpu_devices)
    if devices:
        # A worker thread's Python work (claiming, storing a schedule) holds the GIL for up
        # to the switch interval before the event loop gets it back: 5 ms by default.
        sys.setswitchinterval(min(sys.getswitchinterval(), WORKER_SWITCH_INTERVAL_S))
    workers = [Worker(ctx, device=device) for device in devices]
    for worker in workers:
        worker.start_thread()
        log.info("embedded worker %s serves %s", worker.id, ", ".join(worker.streams))
    return workers


def _refuse_weak_admin_token(settings: Settings) -> None:
    """A public bind guarded by a guessable admin token does not start."""
    weakness = settings.admin_token and admin_token_weakness(settings.admin_token)
    if weakness and not settings.loopback:
        raise ValueError(f"KILN_ADMIN_TOKEN is too weak for a public bind ({weakness}); set a "
                         "long random one, or leave it unset and use `kiln token create "
                         "--role admin`")


def _mount_dashboard(app: FastAPI) -> None:
    """Include the dashboard's router when that package is installed (it lands separately)."""
    if importlib.util.find_spec("service.dashboard") is None:
        log.info("no service.dashboard package: the /admin dashboard is not mounted")
        return
    router = importlib.import_module("service.dashboard.router") if importlib.util.find_spec(
        "service.dashboard.router") else importlib.import_module("service.dashboard")
    app.include_router(router.router)


def app_from_env() -> FastAPI:
    """The API from `KILN_*` variables alone: the factory each process of
    `kiln serve --workers N` calls. Each such process configures its own logging (the
    parent's handlers do not reach it), from KILN_LOG_LEVEL and KILN_LOG_FORMAT."""
    from service import logs

    logs.configure(os.environ.get("KILN_LOG_LEVEL", "info"))
    return create_app(Settings.from_env())
