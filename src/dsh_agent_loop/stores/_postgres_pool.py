"""``PostgresStore``'s connections: a small lazy pool, one worker thread per transaction.

psycopg's async API needs asyncio, so the sync API runs in ``trio.to_thread.run_sync`` under
the pool's ``CapacityLimiter``; the limiter also bounds how many connections are open. Each
thread call is one whole transaction (``_postgres_sync``): none stays open across an await.
Every failure leaves as a ``StoreError`` with its cause chained, except ``flush``'s
``RetryableError`` and ``AmbiguousCommitError``, which are for its caller to sort.

Idempotent transactions (reads, lease acquisition, renewal, release, delete) go through
``run_again``: after a lost connection or a transient failure they are repeated on a new
connection after each of ``retry_delays``. Nothing is re-checked on reconnect: the
transactions check the lease themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Final, TypeVar, final

import psycopg
import trio

from .._errors import StoreError
from . import _postgres_sync as pg

__all__ = ["POOL_SIZE", "Pool", "worth_retrying"]

T = TypeVar("T")

POOL_SIZE: Final = 4


def worth_retrying(exc: StoreError, *, any_error: bool = False) -> bool:
    """A psycopg failure (wrapped by ``Pool.run``) that a repeat on a new connection may cure."""
    cause = exc.__cause__
    if type(exc) is not StoreError or not isinstance(cause, psycopg.Error):
        return False
    return any_error or pg.retryable(cause)


@final
class Pool:
    """Connections to one database, for one table prefix, opened lazily.

    Args:
        dsn: A libpq connection string or URL.
        prefix: The table prefix (the schema is created once, under an advisory lock).
        connection_class: The ``psycopg.Connection`` subclass to connect with.
        retry_delays: Seconds to wait before each repeat in ``run_again``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        prefix: str,
        connection_class: type[pg.Conn],
        retry_delays: Sequence[float],
    ) -> None:
        self._dsn = dsn
        self._prefix = prefix
        self._sql = pg.Sql.build(prefix)
        self._connection_class = connection_class
        self.retry_delays = tuple(retry_delays)
        self._limiter = trio.CapacityLimiter(POOL_SIZE)
        self._idle: list[pg.Conn] = []
        self._schema_ready = False
        self.retries = 0
        """Calls repeated after a failure that stored nothing."""

    def _connect(self) -> pg.Conn:
        conn = self._connection_class.connect(self._dsn, autocommit=False, connect_timeout=10)
        if not self._schema_ready:
            try:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._prefix,))
                for statement in self._sql.schema:
                    conn.execute(statement)
                conn.commit()
            except BaseException:
                conn.close()
                raise
            self._schema_ready = True
        return conn

    def _call(self, fn: Callable[[pg.Sql, pg.Conn], T], fresh: bool) -> T:
        """Run ``fn`` on a pooled (or, with ``fresh``, a new) connection, in a worker thread."""
        conn: pg.Conn | None = None
        if not fresh:
            with contextlib.suppress(IndexError):
                conn = self._idle.pop()  # atomic: worker threads share the list
        if conn is None:
            conn = self._connect()
        try:
            return fn(self._sql, conn)
        finally:
            self._checkin(conn)

    def _checkin(self, conn: pg.Conn) -> None:
        if not conn.closed and not conn.broken and len(self._idle) < POOL_SIZE:
            try:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
            except psycopg.Error:
                pass
            else:
                self._idle.append(conn)
                return
        conn.close()

    async def run(
        self, fn: Callable[[pg.Sql, pg.Conn], T], *, fresh: bool = False, sid: str | None = None
    ) -> T:
        """Run one transaction in a worker thread; every failure leaves as a ``StoreError``.

        (``flush``'s ``RetryableError`` and ``AmbiguousCommitError`` are for its caller.)
        """
        try:
            return await trio.to_thread.run_sync(self._call, fn, fresh, limiter=self._limiter)
        except (StoreError, pg.RetryableError, pg.AmbiguousCommitError):
            raise
        except Exception as exc:  # psycopg's, or a value it cannot send, or a bug
            where = "postgres store" + ("" if sid is None else f", session {sid!r}")
            what = str(exc) if isinstance(exc, psycopg.Error) else f"{type(exc).__name__}: {exc}"
            raise StoreError(f"{where}: {what}") from exc

    async def run_again(
        self,
        fn: Callable[[pg.Sql, pg.Conn], T],
        *,
        fresh: bool = False,
        any_error: bool = False,
        sid: str | None = None,
    ) -> T:
        """Run an idempotent transaction; repeat it after a lost connection or a transient error.

        An acquisition is idempotent because a lease that already carries the claim's token
        is that claim. With ``any_error`` every database error is worth another try
        (releasing a lease). A repeat runs on a new connection.
        """
        for delay in (*self.retry_delays, None):
            try:
                return await self.run(fn, fresh=fresh, sid=sid)
            except StoreError as exc:
                if delay is None or not worth_retrying(exc, any_error=any_error):
                    raise
            self.retries += 1
            fresh = True
            await trio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close the idle connections, once no thread is using one; the pool reopens lazily."""
        borrowers: list[object] = []
        try:
            for _ in range(POOL_SIZE):  # holding every token: no thread is using a connection
                borrower = object()
                await self._limiter.acquire_on_behalf_of(borrower)
                borrowers.append(borrower)
            idle, self._idle = self._idle, []
            for conn in idle:
                await trio.to_thread.run_sync(conn.close)
        finally:
            for borrower in borrowers:
                self._limiter.release_on_behalf_of(borrower)
