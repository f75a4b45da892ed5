"""The `kiln` CLI as a newcomer meets it: one-line errors, required choices, token
management, a worker that refuses to wait on a queue nobody feeds, `--version`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kiln.cli import main
from tests.service.helpers import REPO, service_env


def kiln(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real `kiln` command in a child process (what a user types)."""
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], env=service_env(**env),
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one line on stderr and no traceback."""
    assert result.returncode != 0, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_database_problems_are_one_line(tmp_path: Path) -> None:
    missing = kiln("db", "upgrade",
                   KILN_DATABASE_URL="postgresql://postgres@127.0.0.1:5432/kiln_no_such_db")
    line = one_line_error(missing)
    assert line.startswith("kiln db upgrade: database error:") and "does not exist" in line
    line = one_line_error(kiln("token", "list", KILN_DATABASE_URL="postgres://u@h/db"))
    assert "KILN_DATABASE_URL must be a sqlite:// or postgresql:// URL" in line
    assert "write postgresql://" in line
    line = one_line_error(kiln("serve", KILN_PORT="eighty"))
    assert line.startswith("kiln: invalid configuration: KILN_PORT:")


def test_an_unknown_revision_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(kiln("db", "upgrade", "bogusrev",
                               KILN_DATABASE_URL=f"sqlite:///{tmp_path / 'k.db'}"))
    assert line.startswith("kiln db upgrade: ") and "'bogusrev'" in line
    assert "head" in line  # what to give instead


MIGRATIONS = len(list((REPO / "migrations" / "versions").glob("[0-9]*.py")))


@pytest.mark.parametrize("revision", [f"head-{MIGRATIONS + 1}", f"head-{MIGRATIONS}",
                                      f"base+{MIGRATIONS + 1}", "head+1", "0003-3",
                                      f"0003+{MIGRATIONS - 2}"])
def test_a_relative_revision_past_either_end_is_one_line(tmp_path: Path, revision: str) -> None:
    """Alembic ends such a revision in an AssertionError traceback; kiln refuses it before
    connecting, naming the range it may take."""
    db = tmp_path / "k.db"
    line = one_line_error(kiln("db", "upgrade", revision, KILN_DATABASE_URL=f"sqlite:///{db}"))
    assert line.startswith(f"kiln db upgrade: {revision} is outside the migrations "
                           f"({MIGRATIONS} revisions: base+1 to base+{MIGRATIONS}, "
                           f"head-{MIGRATIONS - 1} to head); give a revision"), line
    assert not db.exists()


def test_a_relative_revision_within_the_migrations_still_upgrades(tmp_path: Path) -> None:
    result = kiln("db", "upgrade", f"head-{MIGRATIONS - 1}",
                  KILN_DATABASE_URL=f"sqlite:///{tmp_path / 'k.db'}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f"is at head-{MIGRATIONS - 1}")


def test_worker_without_a_shared_queue_refuses_to_start(tmp_path: Path) -> None:
    result = kiln("worker", "--device", "cpu",
                  KILN_DATABASE_URL=f"sqlite:///{tmp_path / 'k.db'}")
    assert "KILN_REDIS_URL is not set" in one_line_error(result)


def test_token_create_needs_a_role_and_tokens_can_be_listed_and_revoked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KILN_DATABASE_URL", f"sqlite:///{tmp_path / 'k.db'}")
    assert main(["db", "upgrade"]) == 0
    with pytest.raises(SystemExit) as refused:
        main(["token", "create"])
    assert refused.value.code == 2 and "--role" in capsys.readouterr().err
    assert main(["token", "list"]) == 0
    assert "no tokens yet" in capsys.readouterr().out
    main(["token", "create", "--role", "client", "--name", "ci"])
    token = capsys.readouterr().out.strip()
    main(["token", "create", "--role", "admin"])
    capsys.readouterr()
    assert main(["token", "list"]) == 0
    listing = capsys.readouterr().out
    assert "ci" in listing and "client" in listing and "admin" in listing
    assert token not in listing and listing.count("active") == 2
    assert main(["token", "revoke", "1"]) == 0
    assert capsys.readouterr().out.strip() == "kiln: token 1 revoked"
    main(["token", "list"])
    assert capsys.readouterr().out.count("revoked") == 1
    with pytest.raises(SystemExit, match="no token with id 99"):
        main(["token", "revoke", "99"])

    from service.auth import resolve_token
    from service.context import ServiceContext
    from service.settings import Settings

    ctx = ServiceContext(Settings.from_env())
    with ctx.transaction() as session:
        assert resolve_token(session, token, None) is None  # the revoked token no longer works
    ctx.close()


def test_version() -> None:
    result = kiln("--version")
    assert result.returncode == 0 and result.stdout.startswith("kiln 0.")
    assert "(kiln-compile)" in result.stdout
