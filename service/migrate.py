"""Run the Alembic migrations (`kiln db upgrade`): a start-up step of its own, never on import."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations


def alembic_config(url: str) -> Config:
    """Alembic config for the packaged migrations folder, pointed at `url`."""
    folder = Path(migrations.__file__).parent
    config = Config(str(folder / "alembic.ini"))
    config.set_main_option("script_location", str(folder))
    config.set_main_option("version_locations", str(folder / "versions"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision`."""
    command.upgrade(alembic_config(url), revision)
