"""The `kiln` command: serve, worker, token, db, tune.

Service and tuner modules are imported inside the commands that need them, so the client
package stays importable without the web stack.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import Any

DEVICE_RE = re.compile(r"^(cpu|cuda:\d+)$")


def _settings(**overrides: Any) -> Any:
    from pydantic import ValidationError

    from service.settings import Settings

    try:
        return Settings.from_env(**overrides)
    except ValidationError as exc:
        raise SystemExit(f"kiln: invalid configuration: {exc}") from None


def _require_migrated(url: str) -> None:
    from service.migrate import pending

    problem = pending(url)
    if problem:
        raise SystemExit(f"kiln: {problem}")


def cmd_serve(args: argparse.Namespace) -> int:
    """API + (embedded) worker in one process."""
    import secrets

    settings = _settings(host=args.host, port=args.port)
    if not settings.admin_token:
        settings = settings.model_copy(update={"admin_token": "kiln_" + secrets.token_urlsafe(32)})
        print(f"kiln: admin token for this run (set KILN_ADMIN_TOKEN to choose one): "
              f"{settings.admin_token}", flush=True)
    if settings.database_url.startswith("sqlite"):
        from service.migrate import upgrade

        upgrade(settings.database_url)  # embedded default: the SQLite file needs no setup step
    _require_migrated(settings.database_url)
    embedded = settings.redis_url is None or args.worker
    if args.workers > 1 and embedded:
        raise SystemExit("kiln serve: --workers > 1 needs KILN_REDIS_URL (the processes share "
                         "its queue) and no --worker; run `kiln worker` processes instead")
    if embedded:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU targets are checked on the interpreter
    import uvicorn

    where = "loopback: client endpoints need no token" if settings.loopback else \
        "every endpoint needs a token"
    print(f"kiln: serving on http://{settings.host}:{settings.port} ({where}); database "
          f"{settings.database_url.split('@')[-1]}; queue "
          f"{'redis' if settings.redis_url else 'in-process'}; {args.workers} process(es)",
          flush=True)
    if args.workers > 1:
        # Each process builds its app from the environment: hand it what this one decided.
        os.environ.update(KILN_ADMIN_TOKEN=settings.admin_token, KILN_HOST=settings.host,
                          KILN_PORT=str(settings.port), KILN_LOG_LEVEL=args.log_level)
        uvicorn.run("service.api.app:app_from_env", factory=True, workers=args.workers,
                    host=settings.host, port=settings.port, log_level=args.log_level,
                    access_log=False)
        return 0
    from service.api.app import create_app

    app = create_app(settings, embedded_worker=embedded)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level,
                access_log=False)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """A long-lived worker: SIGTERM finishes the job in hand, a second one gives it back."""
    if not DEVICE_RE.match(args.device):
        raise SystemExit(f"kiln worker: --device must be cpu or cuda:N, not {args.device!r}")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from service.context import ServiceContext
    from service.worker import Worker, install_signal_handlers

    settings = _settings()
    _require_migrated(settings.database_url)
    ctx = ServiceContext(settings)
    try:
        worker = Worker(ctx, device=args.device)
    except RuntimeError as exc:  # no such CUDA device here
        ctx.close()
        raise SystemExit(f"kiln worker: {args.device}: {exc}") from None
    install_signal_handlers(worker)
    try:
        worker.run()
    finally:
        ctx.close()
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    """Create an API token and print it (only its hash is stored)."""
    from service.auth import create_token
    from service.context import ServiceContext

    ctx = ServiceContext(_settings())
    with ctx.transaction() as session:
        token = create_token(session, args.role, args.name)
    ctx.close()
    print(token)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Apply the database migrations."""
    from service.migrate import upgrade

    settings = _settings()
    upgrade(settings.database_url, args.revision)
    print(f"kiln: database at {settings.database_url.split('@')[-1]} is at {args.revision}")
    return 0


def cmd_tune(argv: list[str]) -> int:
    """Compile and tune a model file locally (the tuner's CLI)."""
    from tuner.cli import main as tune_main

    return int(tune_main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln: remote torch.compile service")
    parser.add_argument("--log-level", default=os.environ.get("KILN_LOG_LEVEL", "info"),
                        choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API (and, without Redis, an in-process worker)")
    serve.add_argument("--host", default=None, help="bind address (KILN_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (KILN_PORT; default 8000)")
    serve.add_argument("--worker", action="store_true",
                       help="also run a CPU worker in this process when Redis is configured")
    serve.add_argument("--workers", type=int, default=1,
                       help="API processes sharing the port (needs KILN_REDIS_URL)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("--device", default="cpu", help="cpu or cuda:N")
    worker.set_defaults(func=cmd_worker)

    token = sub.add_parser("token", help="manage API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token and print it once")
    create.add_argument("--role", choices=["client", "admin"], default="client")
    create.add_argument("--name", default=None, help="a note to recognise the token by")
    create.set_defaults(func=cmd_token_create)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply migrations")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=cmd_db_upgrade)

    sub.add_parser("tune", help="compile and tune a model file locally", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `kiln` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `tune` hands everything after it to the tuner's own parser; global options before it
    # (`kiln --log-level debug tune ...`) still apply.
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "tune":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        from service.logs import configure
    except ImportError:  # the client install has no service package: plain logging
        logging.basicConfig(level=args.log_level.upper())
    else:
        configure(args.log_level)
    if args.command == "tune":
        return cmd_tune(rest)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
