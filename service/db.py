"""Engine and sessions. The request or the job owns the transaction: helpers never commit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, pool_size: int = 10) -> Engine:
    """An engine tuned for the backend: WAL and a busy timeout on SQLite, a pool on PG."""
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_pre_ping=True
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=5,
        connect_args={"connect_timeout": 3},
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded values after commit (they are handed to JSON encoders)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session


def insert_ignore(session: Session, table: Any, values: dict[str, Any]) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING on either backend; True when a row was inserted."""
    dialect = session.get_bind().dialect.name
    module = postgresql if dialect == "postgresql" else sqlite
    stmt = module.insert(table).values(**values).on_conflict_do_nothing()
    # RETURNING, not rowcount: drivers disagree on rowcount for a skipped conflict.
    stmt = stmt.returning(*table.primary_key.columns)
    return session.execute(stmt).first() is not None


def upsert_add(session: Session, table: Any, keys: dict[str, Any], column: str, amount: int) -> None:
    """INSERT a counter row or add `amount` to it, atomically, on either backend."""
    dialect = session.get_bind().dialect.name
    module = postgresql if dialect == "postgresql" else sqlite
    stmt = module.insert(table).values(**keys, **{column: amount})
    stmt = stmt.on_conflict_do_update(
        index_elements=list(keys), set_={column: getattr(table.c, column) + amount}
    )
    session.execute(stmt)
