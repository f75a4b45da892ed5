"""Run the Alembic migrations (`kiln db upgrade`): a start-up step of its own, never on import."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config


def migrations_folder() -> Path:
    """The `migrations` package folder: beside `service/` both in a checkout and in an
    installed wheel (found this way, not by import, so that an editable install made before
    the folder existed still finds it)."""
    folder = Path(__file__).resolve().parents[1] / "migrations"
    if not (folder / "alembic.ini").is_file():
        raise RuntimeError(f"kiln's migrations are missing: no {folder / 'alembic.ini'}")
    return folder


def alembic_config(url: str) -> Config:
    """Alembic config for the packaged migrations folder, pointed at `url`."""
    folder = migrations_folder()
    config = Config(str(folder / "alembic.ini"))
    config.set_main_option("script_location", str(folder))
    config.set_main_option("version_locations", str(folder / "versions"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision`."""
    command.upgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The revision the database at `url` is at; None before any migration ran."""
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def pending(url: str) -> str | None:
    """None when the database is at the latest revision, else a sentence saying what to do."""
    from alembic.script import ScriptDirectory
    from sqlalchemy.exc import OperationalError

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    try:
        current = current_revision(url)
    except OperationalError as exc:
        return f"cannot reach the database: {exc.orig}"
    if current == head:
        return None
    return (f"the database is at revision {current or 'none'}, not {head}: "
            "run `kiln db upgrade` first")
