"""Alembic environment and revisions for kiln's database (`kiln db upgrade`)."""
