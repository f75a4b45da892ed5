"""The `kiln` CLI commands of the service, and the deployment files' shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from sqlalchemy import create_engine, inspect, text

from kiln.cli import main
from service.auth import Grant, resolve_token
from service.context import ServiceContext
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def test_db_upgrade_and_token_create(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    monkeypatch.setenv("KILN_DATABASE_URL", url)
    assert main(["db", "upgrade"]) == 0
    tables = set(inspect(create_engine(url)).get_table_names())
    assert {"graphs", "schedules", "jobs", "job_events", "measurements", "workers",
            "api_tokens", "schedule_kernels", "lookup_counts"} <= tables
    capsys.readouterr()
    assert main(["token", "create", "--role", "admin", "--name", "ops"]) == 0
    token = capsys.readouterr().out.strip()
    ctx = ServiceContext(Settings(database_url=url))
    with ctx.transaction() as session:
        assert resolve_token(session, token, None) == Grant("admin", "default")
        stored = session.execute(text("SELECT token_hash FROM api_tokens")).scalar_one()
    ctx.close()
    assert token not in stored and len(stored) == 64  # only the sha256 is kept


def test_a_token_belongs_to_the_tenant_it_was_created_in(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    monkeypatch.setenv("KILN_DATABASE_URL", url)
    assert main(["db", "upgrade"]) == 0
    assert main(["token", "create", "--role", "client", "--tenant", "team-a", "--name", "ci"]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    ctx = ServiceContext(Settings(database_url=url))
    with ctx.transaction() as session:
        assert resolve_token(session, token, None) == Grant("client", "team-a")
    ctx.close()
    assert main(["token", "list"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert "tenant" in listing[0].split() and "team-a" in listing[-1].split()
    for bad in ("*", "a b", "-x", "x" * 65, ""):
        with pytest.raises(SystemExit, match="--tenant: a tenant name is 1-64"):
            main(["token", "create", "--role", "client", f"--tenant={bad}"])


def test_bad_arguments_get_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit, match="--device must be cpu or cuda:N"):
        main(["worker", "--device", "gpu0"])
    monkeypatch.setenv("KILN_DATABASE_URL", "mysql://nope")
    with pytest.raises(SystemExit, match="KILN_DATABASE_URL"):
        main(["db", "upgrade"])
    with pytest.raises(SystemExit):
        main(["token", "create", "--role", "root"])


def test_compose_runs_migrations_first_and_checks_health() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"api", "postgres", "redis", "cpu-worker", "gpu-worker-0"} <= set(services)
    assert "kiln db upgrade &&" in " ".join(services["api"]["command"])
    for name in ("api", "postgres", "redis"):
        assert services[name]["healthcheck"]["test"]
    gpu = services["gpu-worker-0"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert gpu["command"][-1] == "cuda:0" and services["cpu-worker"]["command"][-1] == "cpu"


def test_serve_and_worker_refuse_an_unmigrated_database(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # `kiln worker --device cpu` sets it; restore
    monkeypatch.setenv("KILN_REDIS_URL", "redis://127.0.0.1:1")  # checked after the database
    monkeypatch.setenv("KILN_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    with pytest.raises(SystemExit, match="cannot reach the database"):
        main(["worker", "--device", "cpu"])
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    monkeypatch.setenv("KILN_DATABASE_URL", url)
    with pytest.raises(SystemExit, match="run `kiln db upgrade` first"):
        main(["worker", "--device", "cpu"])
    main(["db", "upgrade"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="cuda:0: no CUDA device"):
            main(["worker", "--device", "cuda:0"])


def test_several_api_processes_need_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KILN_DATABASE_URL", f"sqlite:///{tmp_path / 'k.db'}")
    monkeypatch.setenv("KILN_ADMIN_TOKEN", "x" * 40)
    with pytest.raises(SystemExit, match="--workers > 1 needs KILN_REDIS_URL"):
        main(["serve", "--workers", "2"])


def test_global_options_before_tune_reach_the_tuner_untouched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kiln.cli

    seen: list[list[str]] = []
    monkeypatch.setattr(kiln.cli, "cmd_tune", lambda argv: seen.append(argv) or 0)
    assert main(["--log-level", "debug", "tune", "--trials", "3", "model.py", "--train"]) == 0
    assert seen == [["--trials", "3", "model.py", "--train"]]
    with pytest.raises(SystemExit):  # other commands still refuse unknown options
        main(["db", "upgrade", "--bogus"])
