"""The `kiln` command: serve, worker, token, db, stats, cache, tune.

Service and tuner modules are imported inside the commands that need them, so the client
package stays importable without the web stack. Every error a user can cause ends the
command with one line (`kiln <command>: what happened; what to do`), never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

DEVICE_RE = re.compile(r"^(cpu|cuda:\d+)$")
DISTRIBUTION = "kiln-compile"  # the name on the package index; the import names stay kiln, ...
ADMIN_TOKEN_FILE = "admin-token"  # beside the embedded SQLite database, mode 0600


def _settings(**overrides: Any) -> Any:
    from pydantic import ValidationError

    from service.settings import Settings

    try:
        return Settings.from_env(**overrides)
    except ValidationError as exc:
        hint = " (write postgresql://, not postgres://)" if os.environ.get(
            "KILN_DATABASE_URL", "").startswith("postgres://") else ""
        raise SystemExit(f"kiln: invalid configuration: {_validation_text(exc)}{hint}") from None
    except RuntimeError as exc:  # no writable place for the default database
        raise SystemExit(f"kiln: {exc}") from None


def _validation_text(exc: Any) -> str:
    """pydantic's errors as `KILN_<FIELD>: reason; ...` on one line."""
    parts = []
    for error in exc.errors():
        variable = "KILN_" + "_".join(str(p) for p in error["loc"]).upper()
        reason = str(error["msg"]).removeprefix("Value error, ")
        parts.append(reason if reason.startswith(variable) else f"{variable}: {reason}")
    return "; ".join(parts)


def _one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's text (drivers add hints on later lines)."""
    text = str(getattr(exc, "orig", None) or exc)
    return next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)


def _where(url: str) -> str:
    """A database URL without its credentials, for messages."""
    return url.split("@")[-1]


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on, before anything is registered or printed
    (uvicorn would fail only after the app started)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SystemExit(f"kiln serve: cannot listen on {host}:{port}: {exc.strerror}; is "
                             "another kiln serve running? Choose another port: --port 8001, "
                             "or KILN_PORT=8001 (`make serve PORT=8001`)") from None


def admin_token_file(database_url: str) -> Path | None:
    """Where the embedded default keeps its admin token: beside its SQLite file (None for
    an in-memory SQLite database or PostgreSQL, which set KILN_ADMIN_TOKEN instead)."""
    prefix = "sqlite:///"
    if not database_url.startswith(prefix) or database_url in (prefix, prefix + ":memory:"):
        return None
    return Path(database_url.removeprefix(prefix)).parent / ADMIN_TOKEN_FILE


def persistent_admin_token(path: Path) -> tuple[str, bool]:
    """The admin token stored at `path` (created, readable by this user only, when absent),
    so a restart keeps the operator logged in. Returns (token, whether it was created)."""
    from service.auth import new_token

    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token, False
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


def _admin_token(settings: Any) -> tuple[Any, str]:
    """Settings with an admin token: KILN_ADMIN_TOKEN, else the embedded default's stored
    one, else one for this run only; and how the operator logs in with it (the start
    banner's line: a token kept in a file is printed when created, later its file and the
    command that prints it)."""
    if settings.admin_token:
        return settings, "log in with the admin token in KILN_ADMIN_TOKEN"
    path = admin_token_file(settings.database_url)
    if path is None:
        from service.auth import new_token

        token = new_token()
        login = f"log in with this run's admin token (set KILN_ADMIN_TOKEN to keep one): {token}"
    else:
        token, created = persistent_admin_token(path)
        if created:
            login = f"log in with the new admin token (kept in {path}): {token}"
        else:
            login = f"log in with the admin token in {path} (print it: cat {path})"
    return settings.model_copy(update={"admin_token": token}), login


def _dashboard_url(settings: Any) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}/admin"


def _require_migrated(url: str) -> None:
    from service.migrate import pending

    problem = pending(url)
    if problem:
        raise SystemExit(f"kiln: {_one_line(RuntimeError(problem))} (database {_where(url)})")


def cmd_serve(args: argparse.Namespace) -> int:
    """API + (embedded) worker in one process."""
    settings = _settings(host=args.host, port=args.port)
    embedded = settings.redis_url is None or args.worker
    if args.workers > 1 and embedded:
        raise SystemExit("kiln serve: --workers > 1 needs KILN_REDIS_URL (the processes share "
                         "its queue) and no --worker; run `kiln worker` processes instead")
    check_port_free(settings.host, settings.port)
    with _alembic_quiet(args.log_level):
        if settings.database_url.startswith("sqlite"):
            _upgrade_embedded(settings.database_url)
        _require_migrated(settings.database_url)
    settings, login = _admin_token(settings)
    gpus = _serve_gpus(args.gpus, settings.redis_url is None, args.workers)
    if embedded:
        # CPU targets are checked on the interpreter; GPU tuning children turn it off.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import uvicorn

    from service.api.limits import uvicorn_options

    where = "loopback: client endpoints need no token" if settings.loopback else \
        "every endpoint needs a token"
    print(f"kiln: serving on http://{settings.host}:{settings.port} ({where}); database "
          f"{_where(settings.database_url)}; queue "
          f"{'redis' if settings.redis_url else 'in-process'}; {args.workers} process(es)",
          flush=True)
    print(f"kiln: tuning on {', '.join(gpus)}" if gpus else
          "kiln: no GPU tuning worker (--gpus none, or no GPU visible): schedules stay heuristic "
          "until a `kiln worker --device cuda:N` joins", flush=True)
    if args.workers > 1:
        # Each process builds its app from the environment: hand it what this one decided.
        os.environ.update(KILN_ADMIN_TOKEN=settings.admin_token, KILN_HOST=settings.host,
                          KILN_PORT=str(settings.port), KILN_LOG_LEVEL=args.log_level)
        # One /metrics for all processes (service/metrics.py), in a directory of this run.
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            import tempfile

            os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="kiln-metrics-")
        _print_banner(settings, login)  # the processes start after: no later hook here
        uvicorn.run("service.api.app:app_from_env", factory=True, workers=args.workers,
                    host=settings.host, port=settings.port, log_level=args.log_level,
                    access_log=False, **uvicorn_options())
        return 0
    from service.api.app import create_app

    app = create_app(settings, embedded_worker=embedded, gpu_devices=gpus)

    class BannerServer(uvicorn.Server):
        """Prints the start banner once the app has started: the last lines of a start."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                _print_banner(settings, login)

    server = BannerServer(uvicorn.Config(app, host=settings.host, port=settings.port,
                                         log_level=args.log_level, access_log=False,
                                         **uvicorn_options()))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        return 3  # uvicorn's exit status for a failed start
    print("kiln: stopped", flush=True)
    _end_now(0)


def _end_now(code: int) -> NoReturn:
    """End the process once the server stopped (workers joined, fork servers ended, logs
    flushed), without the interpreter's teardown: with torch, Triton and the app loaded it
    takes about two seconds, which Ctrl-C would otherwise wait for."""
    import atexit

    atexit._run_exitfuncs()  # logging's shutdown among them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextmanager
def _alembic_quiet(log_level: str) -> Iterator[None]:
    """Alembic's INFO lines (its dialect on every start, each migration's description on
    the first: two dozen lines before the banner) kept for `--log-level debug`."""
    alembic = logging.getLogger("alembic")
    level = alembic.level
    if log_level != "debug":
        alembic.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic.setLevel(level)


def _upgrade_embedded(url: str) -> None:
    """Migrate the embedded default's SQLite database (it needs no setup step), in one line
    when a migration ran."""
    from service.migrate import current_revision, upgrade

    before = current_revision(url)
    upgrade(url)
    after = current_revision(url)
    if after != before:
        done = "created" if before is None else f"upgraded from revision {before}"
        print(f"kiln: database {_where(url)} {done}, now at revision {after}", flush=True)


def _print_banner(settings: Any, login: str) -> None:
    """Where the API and the dashboard are, how to log in, how to stop."""
    api = _dashboard_url(settings).removesuffix("/admin")
    print(f"kiln: ready: API {api}, dashboard {_dashboard_url(settings)}\n"
          f"kiln: {login}\n"
          "kiln: stop with Ctrl-C", flush=True)


def _serve_gpus(spec: str | None, embedded_queue: bool, api_processes: int) -> list[str]:
    """The GPUs `kiln serve` tunes on in-process: every visible one by default with the
    in-process queue; none by default with Redis (run `kiln worker --device cuda:N`)."""
    from service.gpus import GpuChoiceError, choose_gpus, visible_gpus

    if spec is None:
        spec = "all" if embedded_queue else "none"
    none = spec.strip().lower() in ("none", "")
    if api_processes > 1 and not none:
        raise SystemExit("kiln serve: --gpus with --workers > 1 would tune on every GPU once per "
                         "process; run `kiln worker --device cuda:N` instead")
    try:  # `none` asks nothing of CUDA
        return [] if none else choose_gpus(spec, visible_gpus())
    except GpuChoiceError as exc:
        raise SystemExit(f"kiln serve: {exc}") from None


def cmd_worker(args: argparse.Namespace) -> int:
    """A long-lived worker: SIGTERM finishes the job in hand, a second one gives it back."""
    if not DEVICE_RE.match(args.device):
        raise SystemExit(f"kiln worker: --device must be cpu or cuda:N, not {args.device!r}")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from service.context import ServiceContext
    from service.worker import Worker, install_signal_handlers

    settings = _settings()
    if settings.redis_url is None:
        raise SystemExit("kiln worker: KILN_REDIS_URL is not set, so no API could hand this "
                         "worker a job; set it to the API's Redis (`kiln serve` alone already "
                         "runs a build worker in its own process)")
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
    """Create an API token in a tenant and print it (only its hash is stored)."""
    from service.auth import create_token
    from service.context import ServiceContext
    from service.tenants import check_tenant

    try:
        check_tenant(args.tenant)
    except ValueError as exc:
        raise SystemExit(f"kiln token create: --tenant: {exc}") from None
    ctx = ServiceContext(_settings())
    try:
        with ctx.transaction() as session:
            token = create_token(session, args.role, args.name, args.tenant)
    finally:
        ctx.close()
    print(token)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    """List the stored tokens (id, role, tenant, name, created, revoked); never a token
    itself."""
    from service.context import ServiceContext
    from service.store import tokens
    from tuner.report import table

    ctx = ServiceContext(_settings())
    try:
        with ctx.transaction() as session:
            rows = [[str(t.id), t.role, t.tenant, t.name or "-",
                     t.created_at.strftime("%Y-%m-%d %H:%M"), "revoked" if t.revoked else "active"]
                    for t in tokens.list_tokens(session)]
    finally:
        ctx.close()
    print(table(["id", "role", "tenant", "name", "created (UTC)", "state"], rows) if rows else
          "kiln: no tokens yet (`kiln token create --role client|admin`)")
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    """Revoke a token by its id (`kiln token list`); the API stops accepting it within 30 s."""
    from service.context import ServiceContext
    from service.store import tokens

    ctx = ServiceContext(_settings())
    try:
        with ctx.transaction() as session:
            if not tokens.revoke_token(session, args.id):
                raise SystemExit(f"kiln token revoke: no token with id {args.id} "
                                 "(see `kiln token list`)")
    finally:
        ctx.close()
    print(f"kiln: token {args.id} revoked")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Apply the database migrations."""
    from service.migrate import upgrade

    settings = _settings()
    _check_revision(settings.database_url, args.revision)
    upgrade(settings.database_url, args.revision)
    print(f"kiln: database at {_where(settings.database_url)} is at {args.revision}")
    return 0


REVISION_HINT = "give a revision in migrations/versions/, or none for the latest (head)"


def _check_revision(url: str, revision: str) -> None:
    """Refuse a revision the migrations do not have before connecting (Alembic's own
    error comes after its log lines, as a traceback); relative ones (`+1`, `head-2`) are
    left to Alembic, whose error `_run` makes one line as well."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from service.migrate import alembic_config

    script = ScriptDirectory.from_config(alembic_config(url))
    relative = re.fullmatch(r"(.*?)([+-]\d+)", revision)
    try:
        if relative is None:
            script.get_revisions(revision)
        elif relative.group(1):  # from the current revision (`+1`): Alembic checks it
            _check_relative(script, revision, relative.group(1), int(relative.group(2)))
    except CommandError as exc:
        raise SystemExit(f"kiln db upgrade: {exc}; {REVISION_HINT}") from None


def _check_relative(script: Any, revision: str, anchor: str, steps: int) -> None:
    """Refuse `anchor±steps` past either end of a linear history (Alembic's own check ends
    in an AssertionError); branched histories are left to Alembic."""
    if len(script.get_heads()) != 1:
        return
    chain = [r.revision for r in reversed(list(script.walk_revisions()))]  # oldest first
    ends = {"base": -1, "head": len(chain) - 1, "heads": len(chain) - 1}
    at = ends[anchor] if anchor in ends else chain.index(script.get_revision(anchor).revision)
    if not 0 <= at + steps < len(chain):
        n = len(chain)
        raise SystemExit(f"kiln db upgrade: {revision} is outside the migrations ({n} "
                         f"revisions: base+1 to base+{n}, head-{n - 1} to head); {REVISION_HINT}")


def cmd_db_prune(args: argparse.Namespace) -> int:
    """Delete old records as the retention policy says (service/store/retention.py)."""
    from service.context import ServiceContext
    from service.store.retention import Policy, prune

    given = {name: getattr(args, name) for name in ("events_days", "measurements_days",
                                                    "counters_days", "workers_days",
                                                    "wire_days")}
    policy = Policy(**{name: days for name, days in given.items() if days is not None})
    ctx = ServiceContext(_settings())
    try:
        with ctx.transaction() as session:
            counts = prune(session, policy, dry_run=args.dry_run)
    finally:
        ctx.close()
    verb = "would delete" if args.dry_run else "deleted"
    print(f"kiln: {verb} " + ", ".join(f"{n} {name.replace('_', ' ')}"
                                       for name, n in counts.items()))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """`kiln stats` through the admin API (kiln/cli_client.py). The token: KILN_ADMIN_TOKEN,
    else KILN_TOKEN, else, for a service on this machine, the one `kiln serve` keeps."""
    from kiln.cli_client import show_stats

    token = os.environ.get("KILN_ADMIN_TOKEN") or os.environ.get("KILN_TOKEN")
    url = args.url if args.url is not None else os.environ.get("KILN_URL", "")
    return show_stats(args, token or _stored_admin_token(url))


def _stored_admin_token(url: str) -> str | None:
    """The embedded default's admin token file, read only for a loopback URL (never sent
    elsewhere), and only where the service is installed; None otherwise."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname if url else "127.0.0.1"
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    try:
        from service.settings import default_database_url
    except ImportError:  # a client install: no server here
        return None
    try:
        path = admin_token_file(os.environ.get("KILN_DATABASE_URL") or default_database_url())
        token = path.read_text().strip() if path is not None else ""
    except (OSError, RuntimeError):
        return None
    return token or None


def cmd_tune(argv: list[str]) -> int:
    """Compile and tune a model file locally (the tuner's CLI)."""
    from tuner.cli import main as tune_main

    return int(tune_main(argv) or 0)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{version(DISTRIBUTION)} ({DISTRIBUTION})"
    except PackageNotFoundError:
        return "(not installed as a distribution: running from a source tree)"


def _run(args: argparse.Namespace) -> int:
    """Run a subcommand; a database or Redis that cannot be reached is one line, not a
    traceback (a missing database, a refused connection, a wrong password)."""
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        reason = _service_error(exc)
        if reason is None:
            raise
        words = [args.command, getattr(args, "token_command", None), getattr(args, "db_command", None),
                 getattr(args, "cache_command", None)]
        raise SystemExit(f"kiln {' '.join(w for w in words if w)}: {reason}") from None


def _service_error(exc: Exception) -> str | None:
    """A sentence for an unreachable database or queue, or None for any other error."""
    try:
        from alembic.util import CommandError
        from redis.exceptions import ConnectionError as RedisConnectionError
        from sqlalchemy.exc import DBAPIError

        from service.queue import QueueUnavailable
    except ImportError:  # the client install: no service commands ran
        return None
    if isinstance(exc, CommandError):  # Alembic's: a revision it cannot reach
        return f"{exc}; {REVISION_HINT}"
    if isinstance(exc, DBAPIError):
        return f"database error: {_one_line(exc)}; check KILN_DATABASE_URL (does the database exist?)"
    if isinstance(exc, RedisConnectionError | QueueUnavailable):
        return f"cannot reach Redis (KILN_REDIS_URL): {_one_line(exc)}"
    return None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln: remote torch.compile service")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
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
    serve.add_argument("--gpus", default=None, metavar="all|none|0,1",
                       help="GPUs to tune on in this process, one tuning worker each (default: "
                            "all visible GPUs with the in-process queue, none with KILN_REDIS_URL)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("--device", default="cpu", help="cpu or cuda:N")
    worker.set_defaults(func=cmd_worker)

    token = sub.add_parser("token", help="manage API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser(
        "create", help="create a token and print it once",
        description="Create an API token and print it once (only its sha256 is stored). "
                    "Its tenant scopes the plans its clients store and read: a job runs only "
                    "plans of its own tenant or ones an admin published to all; schedules "
                    "and binaries are shared by every tenant.")
    create.add_argument("--role", choices=["client", "admin"], required=True,
                        help="client: submit and fetch schedules and plans; admin: also the "
                             "dashboard and admin API")
    create.add_argument("--tenant", default="default", metavar="NAME",
                        help="the tenant the token belongs to: 1-64 letters, digits, '.', '_', "
                             "'-' (default: default; anonymous callers of a loopback bind are "
                             "the tenant 'local')")
    create.add_argument("--name", default=None, help="a note to recognise the token by")
    create.set_defaults(func=cmd_token_create)
    token_sub.add_parser("list", help="list tokens (never the tokens themselves)").set_defaults(
        func=cmd_token_list)
    revoke = token_sub.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("id", type=int, help="the token's id in `kiln token list`")
    revoke.set_defaults(func=cmd_token_revoke)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply migrations")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=cmd_db_upgrade)
    prune = db_sub.add_parser("prune", help="delete old events, superseded measurements, "
                              "counters, dead workers, expired sessions and, if asked, "
                              "unused graph bodies")
    for name, what, days in (("events", "status history of finished jobs", 30),
                             ("measurements", "measurements of superseded tuning passes", 30),
                             ("counters", "per-minute hit and miss counters", 90),
                             ("workers", "stopped and dead workers", 7)):
        prune.add_argument(f"--{name}-days", type=float, metavar="N",
                           help=f"keep {what} for N days (default {days}: service.store.retention)")
    prune.add_argument("--wire-days", type=float, metavar="N",
                       help="also drop the stored wire form of graphs whose entries were "
                       "unused for N days (off unless given; a resubmission stores it again)")
    prune.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    prune.set_defaults(func=cmd_db_prune)

    from kiln.cli_client import add_parsers

    add_parsers(sub, cmd_stats)

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
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
