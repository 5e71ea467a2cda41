"""The fleet's connection to its store's database: transactions in a worker thread, and wake-ups.

``FleetDb.of(store)`` reads where a ``SqliteStore`` or ``PostgresStore`` keeps its sessions and
opens the fleet's own connection there (docs/design.md#fleet-tables); any other store is a
``ConfigError`` naming the stores that can carry a fleet. The connection opens on first use and
creates the tables (``IF NOT EXISTS``); each call of ``run`` is one transaction of one function of
``sql``, in a worker thread, on one of at most ``POOL`` connections. On SQLite the
functions that only read (``sql.READS``) begin a deferred transaction; the others take the write
lock at once (``BEGIN IMMEDIATE``), so two writers never deadlock on an upgrade.

Failures. A lost PostgreSQL connection (or a busy SQLite file past its timeout) is a
``StoreError``; the connection is dropped and the next call opens a new one. Calls that are safe
to repeat (every read, and ``send`` with its fixed message id) are tried again a few times on a
fresh connection first, with capped backoff.

Waking. On PostgreSQL ``notified()`` waits (a slice at a time) on ``LISTEN <prefix>fleet`` on a
dedicated connection; sends and commands ``NOTIFY`` in their transaction, so the wake-up follows
the commit. SQLite has no notifications: its workers poll.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, final

import trio

from .._errors import ConfigError, StoreError
from .._session.store import SessionStore
from . import sql as _sql

__all__ = ["FleetDb"]

T = TypeVar("T")

#: Seconds before each repeat of a call that is safe to repeat.
RETRY_DELAYS: Final = (0.05, 0.2, 0.5, 1.0, 2.0)
#: Connections one ``FleetDb`` opens at most (transactions in flight at once).
POOL: Final = 4
#: Seconds a ``LISTEN`` wait blocks its thread at most (bounds how long a cancel waits).
LISTEN_SLICE: Final = 0.5


@final
class _Tx:
    """``_sql.Tx`` over a DB-API cursor."""

    def __init__(self, cursor: Any, dialect: str) -> None:
        self._cursor = cursor
        self.dialect = dialect

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.dialect == "postgresql" else sql

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._cursor.execute(self._sql(sql), tuple(params))
        if self._cursor.description is None:
            return []
        return list(self._cursor.fetchall())

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._cursor.execute(self._sql(sql), tuple(params))
        return int(self._cursor.rowcount)


@final
class FleetDb:
    """The fleet's tables in one store's database (see the module docstring)."""

    def __init__(self, dialect: str, target: str, prefix: str, lease: float | None) -> None:
        self.dialect = dialect
        self.prefix = prefix
        self.store_lease = lease
        """The store's own write lease (PostgreSQL), or None (SQLite: the kernel's lock)."""
        self._target = target
        self._idle: list[Any] = []
        """Open connections not in use (at most ``POOL`` exist)."""
        self._listener: Any = None
        self._slots = trio.Semaphore(POOL)
        self._listen_lock = trio.Lock()
        self._created = False
        """The tables were created (by the first connection)."""

    @staticmethod
    def of(store: SessionStore) -> FleetDb:
        """The fleet tables of ``store``'s database.

        Raises:
            ConfigError: the store cannot carry a fleet (only SQLite and PostgreSQL can).
        """
        from ..stores.sqlite import SqliteStore

        if isinstance(store, SqliteStore):
            return FleetDb("sqlite", store.path, "dsh_", None)
        try:
            from ..stores.postgres import PostgresStore
        except ImportError:  # the postgres extra is not installed: it cannot be one
            PostgresStore = None  # type: ignore[assignment,misc]
        if PostgresStore is not None and isinstance(store, PostgresStore):
            return FleetDb("postgresql", store.dsn, store.table_prefix, store.lease_ttl)
        raise ConfigError(
            f"a fleet needs a store every process can reach: SqliteStore (sqlite:///PATH, the"
            f" processes of one machine) or PostgresStore (postgresql://..., many machines),"
            f" not {type(store).__name__}"
        )

    # --- connections (worker thread) -------------------------------------------------------------

    def _connect(self) -> Any:
        conn: Any
        if self.dialect == "sqlite":
            conn = sqlite3.connect(
                self._target, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        else:
            import psycopg

            conn = psycopg.connect(self._target, autocommit=False, connect_timeout=10)
        if not self._created:
            self._transaction(conn, lambda tx: _sql.create_tables(tx, self.prefix))
            self._created = True
        return conn

    def _transaction(self, conn: Any, fn: Callable[[_sql.Tx], T], read: bool = False) -> T:
        if self.dialect == "sqlite":
            cursor = conn.cursor()
            cursor.execute("BEGIN" if read else "BEGIN IMMEDIATE")
            try:
                result = fn(_Tx(cursor, "sqlite"))
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            cursor.execute("COMMIT")
            return result
        try:
            with conn.cursor() as cursor:
                result = fn(_Tx(cursor, "postgresql"))
            conn.commit()
            return result
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise

    def _call(
        self, conn: Any, fn: Callable[[_sql.Tx], T], read: bool
    ) -> tuple[Any, T | None, Exception | None]:
        """Run ``fn`` on ``conn`` (a new one when None).

        Returns the connection to keep (None: it failed and is closed), the result, and the
        exception ``fn`` raised that is not the database's (its transaction was rolled back; the
        connection is still good).

        Raises:
            StoreError: the database failed (the connection is closed).
        """
        try:
            if conn is None:
                conn = self._connect()
            return conn, self._transaction(conn, fn, read), None
        except (sqlite3.Error, OSError) as exc:
            _close(conn)
            raise StoreError(f"fleet tables: {exc}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg"):
                _close(conn)
                raise StoreError(f"fleet tables: {exc}") from exc
            return conn, None, exc

    # --- trio side -------------------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any, again: bool = False) -> T:
        """Run ``fn(tx, prefix, *args)`` as one transaction; ``again``: safe to repeat.

        Raises:
            StoreError: the database failed (after the repeats, when ``again``).
        """
        bound: Callable[[_sql.Tx], T] = lambda tx: fn(tx, self.prefix, *args)  # noqa: E731
        delays = RETRY_DELAYS if again else ()
        for delay in (*delays, None):
            try:
                async with self._slots:
                    conn = self._idle.pop() if self._idle else None
                    conn, result, error = await trio.to_thread.run_sync(
                        self._call, conn, bound, fn in _sql.READS
                    )
                    self._idle.append(conn)
                    if error is not None:
                        raise error
                    return result  # type: ignore[return-value]  # no error: fn's result
            except StoreError:
                if delay is None:
                    raise
            await trio.sleep(delay)
        raise AssertionError("unreachable")

    async def notified(self) -> bool:
        """Wait up to ``LISTEN_SLICE`` seconds for a ``NOTIFY``; True when one came.

        PostgreSQL only; a failed connection is reopened on the next call (after a pause).
        """
        async with self._listen_lock:
            try:
                return await trio.to_thread.run_sync(self._listen_once)
            except StoreError:
                await trio.sleep(LISTEN_SLICE)
                return False

    def _listen_once(self) -> bool:
        """Wait up to ``LISTEN_SLICE`` for a notification (worker thread)."""
        try:
            if self._listener is None:
                import psycopg

                conn = psycopg.connect(self._target, autocommit=True, connect_timeout=10)
                conn.execute(f"LISTEN {self.prefix}fleet")
                self._listener = conn
            return any(True for _ in self._listener.notifies(timeout=LISTEN_SLICE, stop_after=1))
        except Exception as exc:
            listener, self._listener = self._listener, None
            if listener is not None:
                with contextlib.suppress(Exception):
                    listener.close()
            raise StoreError(f"fleet notifications: {exc}") from exc

    async def aclose(self) -> None:
        """Close the connections (the next call reconnects)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await trio.to_thread.run_sync(_close, conn)
        async with self._listen_lock:
            listener, self._listener = self._listener, None
            if listener is not None:
                await trio.to_thread.run_sync(listener.close)


def _close(conn: Any) -> None:
    """Close ``conn`` (None, or already broken: nothing to do)."""
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
