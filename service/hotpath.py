"""The schedule fetch that every client start makes, kept off the ORM and the threadpool.

On PostgreSQL it runs one prepared statement (service.store.lookup) on a small pool of async
autocommit connections (no BEGIN/COMMIT, no thread hop); on SQLite (the embedded default) it
runs the same query through SQLAlchemy Core in a thread, on read-only connections of its own
that wait at most `SQLITE_BUSY_S` for a lock (a writer holding the file exclusively): past
it the lookup answers 503 with Retry-After instead of holding the request for the 30 s the
service's writers wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool

from service.context import ServiceContext
from service.store.lookup import Lookup, lookup_pg, lookup_sync

log = logging.getLogger(__name__)
SQLITE_BUSY_S = 1.0  # a lookup's longest wait for a locked SQLite file


class DatabaseUnavailable(RuntimeError):
    """The database did not answer the lookup."""


class ScheduleReader:
    """Looks up one key; `lookup` returns None for an unknown key."""

    def __init__(self, ctx: ServiceContext, pool_size: int = 8) -> None:
        """A reader for the database of `ctx`, with up to `pool_size` connections."""
        self.ctx = ctx
        url = make_url(ctx.settings.database_url)
        self._pg = url.get_backend_name() == "postgresql"
        self._conninfo = ""
        if self._pg:
            self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._pool: asyncio.Queue | None = None
        self._size = pool_size
        self._made = 0
        self._sqlite = None if self._pg else _sqlite_reader(ctx.engine)

    async def lookup(self, key: str) -> Lookup | None:
        """What the database holds for `key`; raises DatabaseUnavailable when it is down or
        (SQLite) locked past SQLITE_BUSY_S."""
        if self._sqlite is not None:
            try:
                return await run_in_threadpool(lookup_sync, self._sqlite, key)
            except DBAPIError as exc:  # "database is locked", an unreadable file
                raise DatabaseUnavailable(str(exc.orig)) from exc
            except PoolTimeout as exc:
                raise DatabaseUnavailable("no database connection free within 5 s") from exc
        import psycopg

        for attempt in (1, 2):
            conn = await self._acquire()
            try:
                found = await lookup_pg(conn, key)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # A broken connection means the others are suspect too (a database restart):
                # drop them all, and try once more on a fresh one.
                await self._discard(conn)
                await self._drain()
                if attempt == 2:
                    raise DatabaseUnavailable(str(exc)) from exc
                continue
            except BaseException:
                await self._discard(conn)
                raise
            self._release(conn)
            return found
        raise AssertionError("unreachable")

    async def _acquire(self):  # type: ignore[no-untyped-def]
        import psycopg

        if self._pool is None:
            self._pool = asyncio.Queue()
        if self._pool.empty() and self._made < self._size:
            self._made += 1
            try:
                return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True,
                                                             connect_timeout=3)
            except psycopg.OperationalError as exc:
                self._made -= 1
                raise DatabaseUnavailable(str(exc)) from exc
        try:
            return await asyncio.wait_for(self._pool.get(), timeout=5)
        except TimeoutError:
            raise DatabaseUnavailable("no database connection free within 5 s") from None

    def _release(self, conn) -> None:  # type: ignore[no-untyped-def]
        assert self._pool is not None
        self._pool.put_nowait(conn)

    async def _discard(self, conn) -> None:  # type: ignore[no-untyped-def]
        self._made -= 1
        try:
            await conn.close()
        except Exception:  # already broken
            log.debug("closing a broken connection failed", exc_info=True)

    async def _drain(self) -> None:
        while self._pool is not None and not self._pool.empty():
            await self._discard(self._pool.get_nowait())

    async def close(self) -> None:
        """Close pooled connections."""
        await self._drain()
        if self._sqlite is not None and self._sqlite is not self.ctx.engine:
            self._sqlite.dispose()


def _sqlite_reader(engine: Engine) -> Engine:
    """An engine on the same SQLite file whose connections only read and give up on a lock
    after SQLITE_BUSY_S; an in-memory database has no file to share: its own engine."""
    if engine.url.database in (None, "", ":memory:"):
        return engine
    reader = create_engine(engine.url, pool_timeout=5,
                           connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_S})

    @event.listens_for(reader, "connect")
    def _read_only(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_S * 1000)}")
        cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    return reader
