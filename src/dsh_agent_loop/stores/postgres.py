"""``PostgresStore``: sessions in PostgreSQL, shared by many processes and machines.

Design. Ownership is a lease row (session_id, owner token, epoch, host, pid, expires_at),
taken in one transaction that locks the row, and checked again, ``FOR UPDATE``, inside every
append transaction: the token, the epoch and the expiry (by the database clock) must all
still match. A paused owner that wakes up after its lease expired and another process took
over (epoch + 1) is therefore rejected with ``SessionOwnershipLostError`` instead of writing
(a lock alone cannot fence it). Taking over needs the lease to have expired; the session
writer calls ``renew`` every ``lease_ttl / 3`` to keep it.

psycopg's async API needs asyncio, so the sync API runs in ``trio.to_thread.run_sync`` under
the store's ``CapacityLimiter``; the limiter also bounds the small pool of connections the
store opens lazily. Each thread call is one whole transaction (``_postgres_sync``): none
stays open across an await. Events carry a sha256 of their JSON; if the connection fails
after ``COMMIT`` was sent, the outcome is settled by reading the (session, seq) rows back on a
fresh connection, under the lease row's lock, and comparing those hashes — never by sending
the batch blindly again. Once nothing is known to be stored, a flush that failed for a reason
that may pass (a lost connection, a serialization failure, a deadlock, a lock not available)
is tried again a few times on a fresh connection; idempotent transactions (reads, lease
acquisition, renewal, release) likewise. Other errors (disk full) fail the flush.

Reconnecting. A lost connection (no SQLSTATE, class 08, or the server ending the session:
``57P01`` as ``pg_terminate_backend`` sends, ``57P02``, ``57P03`` while it restarts) is retried
on a new connection after each of ``retry_delays`` (capped exponential by default, about 6.5 s
in all); past them the call raises ``StoreError``. Nothing is re-checked on reconnect: the
retried transaction checks the lease (token, epoch, expiry) itself, so a session taken over
while this process was cut off raises ``SessionOwnershipLostError`` and writes nothing, and
a retried batch is neither lost nor duplicated (a lost ``COMMIT`` is read back first).
Every failure of a store method is a ``StoreError``: psycopg's, and any other (a value the
driver cannot send, stored text that does not decode), with its cause chained.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeVar, final, overload

import attrs
import psycopg
import trio

from .._frozen import freeze
from ..errors import (
    SessionOwnershipLostError,
    StoreError,
)
from ..events import Event
from ..session.store import ReadHandle, SessionInfo, WriteHandle
from . import _postgres_sync as pg
from ._check import check_range, read_stored_and_staged, stage
from ._rows import last_turn_end, load_header

__all__ = ["PostgresStore"]

T = TypeVar("T")

_POOL_SIZE: Final = 4
#: Releasing after a timed-out close gets this much extra time (best effort).
_RELEASE_GRACE: Final = 1.0
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def capped_backoff(first: float, cap: float, count: int) -> tuple[float, ...]:
    """``count`` delays doubling from ``first``, each at most ``cap``."""
    return tuple(min(first * 2**i, cap) for i in range(count))


#: Seconds to wait before each repeat of a call that failed and may work on a new connection.
RETRY_DELAYS: Final = capped_backoff(0.02, 2.0, 9)


# --- handles -----------------------------------------------------------------------------------


@attrs.define(eq=False)
class _PgReadHandle:
    _store: PostgresStore
    _session_id: str
    _header: Mapping[str, Any]

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def header(self) -> Mapping[str, Any]:
        return self._header

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        stop = check_range(offset, length)
        read = partial(pg.events, sid=self._session_id, start=offset, stop=stop)
        return await self._store._run_again(read, sid=self._session_id)

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class _PgWriteHandle:
    _store: PostgresStore
    _session_id: str
    _header: Mapping[str, Any]
    _token: str
    _epoch: int
    _stored_count: int
    _staged: list[Event] = attrs.Factory(list)
    _failure: StoreError | None = None
    _closed: bool = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def header(self) -> Mapping[str, Any]:
        return self._header

    @property
    def lease_ttl(self) -> float | None:
        return self._store.lease_ttl

    async def _fetch(self, start: int, stop: int) -> list[Event]:
        fetch = partial(pg.events, sid=self._session_id, start=start, stop=stop)
        return await self._store._run_again(fetch, sid=self._session_id)

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        return await read_stored_and_staged(
            offset, length, self._stored_count, self._staged, self._fetch
        )

    async def append(self, events: Sequence[Event]) -> None:
        self._check_usable()
        await stage(self._session_id, self._stored_count, self._staged, events, self._fetch)
        self._check_usable()

    async def flush(self) -> None:
        self._check_usable()
        await self._flush()

    async def _flush(self) -> None:
        if not self._staged:
            await trio.lowlevel.checkpoint()
            return
        if self._failure is not None:
            raise self._failure
        batch = self._staged[: len(self._staged)]
        rows = self._rows(batch)
        txn = partial(
            pg.flush,
            sid=self._session_id,
            token=self._token,
            epoch=self._epoch,
            rows=rows,
            last=last_turn_end(batch),
        )
        fresh = False
        for delay in (*self._store._retry_delays, None):
            try:
                await self._store._run(txn, fresh=fresh, sid=self._session_id)
                break
            except SessionOwnershipLostError as exc:
                self._failure = exc
                raise
            except pg.AmbiguousCommitError as exc:
                if await self._resolve(rows):
                    break
                error = StoreError(
                    f"session {self._session_id!r}: the connection failed during commit and "
                    f"nothing was stored ({exc})"
                )
                error.__cause__ = exc.__cause__
            except pg.RetryableError as exc:
                error = StoreError(f"session {self._session_id!r}: nothing was stored ({exc})")
                error.__cause__ = exc.__cause__
            except StoreError as exc:  # connecting failed, or a final error
                if not _worth_retrying(exc):
                    raise
                error = exc
            if delay is None:
                raise error
            self._store._retries += 1
            fresh = True  # nothing was stored: a new connection may do better
            await trio.sleep(delay)
        self._stored_count += len(batch)
        del self._staged[: len(batch)]

    def _rows(self, batch: list[Event]) -> list[pg.Row]:
        """Encode ``batch``; an event that cannot be encoded fails the handle for good."""
        try:
            return [pg.Row.of(e) for e in batch]
        except Exception as exc:
            self._failure = StoreError(
                f"session {self._session_id!r}: an event cannot be stored "
                f"({type(exc).__name__}: {exc}); the session writes no more"
            )
            raise self._failure from exc

    async def _resolve(self, rows: list[pg.Row]) -> bool:
        """Settle an ambiguous commit by reading back: did it commit?"""
        try:
            resolve = partial(pg.resolve, sid=self._session_id, rows=rows)
            return await self._store._run_again(resolve, fresh=True, sid=self._session_id)
        except StoreError as exc:
            self._failure = StoreError(
                f"session {self._session_id!r}: the outcome of a commit is unknown ({exc})"
            )
            raise self._failure from exc

    async def renew(self) -> None:
        self._check_usable()
        renew = partial(
            pg.renew,
            sid=self._session_id,
            token=self._token,
            epoch=self._epoch,
            ttl=self._store.lease_ttl,
        )
        if not await self._store._run_again(renew, sid=self._session_id):
            self._failure = pg.lost(self._session_id)
            raise self._failure

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        error: Exception | None = None
        timeout = self._store._close_timeout
        deadline = trio.current_time() + timeout
        with trio.CancelScope(shield=True):
            with trio.move_on_at(deadline) as scope:
                try:
                    await self._flush()
                except Exception as exc:  # raised once the lease is released
                    error = exc
            if scope.cancelled_caught:
                error = StoreError(
                    f"session {self._session_id!r}: close timed out after {timeout}s; "
                    f"{len(self._staged)} unflushed events dropped"
                )
            release_error = await self._release(deadline)
        error = error or release_error
        if error is not None:
            raise error

    async def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            error = await self._release(trio.current_time() + self._store._close_timeout)
        if error is not None:
            raise error

    async def _release(self, deadline: float) -> StoreError | None:
        """Drop staged events, give the lease up; remove the session if nothing was stored.

        Past ``deadline`` it still gets a short grace: releasing is worth a try.
        """
        self._staged.clear()
        release = partial(
            pg.release,
            sid=self._session_id,
            token=self._token,
            epoch=self._epoch,
            drop_if_empty=self._stored_count == 0,
        )
        with trio.move_on_at(max(deadline, trio.current_time() + _RELEASE_GRACE)):
            try:
                await self._store._run_again(release, any_error=True, sid=self._session_id)
            except StoreError as exc:
                return exc
            return None
        return StoreError(f"session {self._session_id!r}: releasing the lease timed out")

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("write handle is closed")
        if self._failure is not None:
            raise self._failure


# --- the store ---------------------------------------------------------------------------------


@final
class PostgresStore:
    """Sessions in PostgreSQL; write ownership is a lease with a fencing epoch.

    Args:
        dsn: A libpq connection string or ``postgresql://`` URL.
        lease_ttl: Seconds a write lease lasts without ``renew``; another process may take
            the session over once it has expired.
        close_timeout: Bound, in seconds, on a write handle's ``close``.
        table_prefix: Prefix of the three table names (``[a-z_][a-z0-9_]*``), so several
            stores can share one database.
        connection_class: The ``psycopg.Connection`` subclass to connect with (its
            ``connect`` is called); tests pass one that injects faults.
        retry_delays: Seconds to wait before each repeat of a call that failed for a reason
            that may pass (a lost connection, a serialization failure); their number is the
            retry budget. Default ``RETRY_DELAYS``: 0.02 s doubling up to 2 s, 9 repeats.
    """

    def __init__(
        self,
        dsn: str,
        *,
        lease_ttl: float = 30.0,
        close_timeout: float = 10.0,
        table_prefix: str = "dsh_",
        connection_class: type[pg.Conn] = psycopg.Connection,
        retry_delays: Sequence[float] = RETRY_DELAYS,
    ) -> None:
        if not _PREFIX.fullmatch(table_prefix):
            raise ValueError(f"table_prefix must match [a-z_][a-z0-9_]*, not {table_prefix!r}")
        if lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive")
        if any(delay < 0 for delay in retry_delays):
            raise ValueError("retry_delays must not be negative")
        self._dsn = dsn
        self._lease_ttl = float(lease_ttl)
        self._close_timeout = close_timeout
        self._prefix = table_prefix
        self._sql = pg.Sql.build(table_prefix)
        self._limiter = trio.CapacityLimiter(_POOL_SIZE)
        self._idle: list[pg.Conn] = []
        self._schema_ready = False
        self._connection_class = connection_class
        self._retries = 0
        self._retry_delays = tuple(retry_delays)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def lease_ttl(self) -> float:
        """Seconds a write lease lasts; the session writer renews every third of it."""
        return self._lease_ttl

    # --- connections ---

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
        if not conn.closed and not conn.broken and len(self._idle) < _POOL_SIZE:
            try:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
            except psycopg.Error:
                pass
            else:
                self._idle.append(conn)
                return
        conn.close()

    async def _run(
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

    async def _run_again(
        self,
        fn: Callable[[pg.Sql, pg.Conn], T],
        *,
        fresh: bool = False,
        any_error: bool = False,
        sid: str | None = None,
    ) -> T:
        """Run an idempotent transaction; repeat it after a lost connection or a transient error.

        Reads, ``renew``, ``release`` and ``delete`` are idempotent as they stand; an
        acquisition is, because a lease that already carries the claim's token is that claim.
        With ``any_error`` every database error is worth another try (releasing a lease).
        A repeat runs on a new connection.
        """
        for delay in (*self._retry_delays, None):
            try:
                return await self._run(fn, fresh=fresh, sid=sid)
            except StoreError as exc:
                if delay is None or not _worth_retrying(exc, any_error=any_error):
                    raise
            self._retries += 1
            fresh = True
            await trio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _claim(self) -> pg.Claim:
        return pg.Claim(secrets.token_hex(16), socket.gethostname(), os.getpid(), self._lease_ttl)

    # --- SessionStore ---

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take its write lease.

        Raises:
            SessionAlreadyExistsError: the id has stored events.
            SessionAlreadyOwnedError: a live lease holds the (not yet flushed) id.
        """
        frozen = freeze(dict(header))
        sid, claim = str(frozen["session_id"]), self._claim()
        epoch, _, _ = await self._run_again(
            partial(pg.acquire, sid=sid, claim=claim, header=frozen), sid=sid
        )
        handle = _PgWriteHandle(self, sid, frozen, claim.token, epoch, 0)
        if inherited_events:
            await handle.append(list(inherited_events))
        return handle

    @overload
    async def open(self, session_id: str, mode: Literal["write"]) -> WriteHandle: ...
    @overload
    async def open(self, session_id: str, mode: Literal["read"] = "read") -> ReadHandle: ...
    async def open(
        self, session_id: str, mode: Literal["read", "write"] = "read"
    ) -> ReadHandle | WriteHandle:
        """Open a stored session for reading, or for writing (taking the lease).

        Raises:
            SessionNotFoundError: no stored event for ``session_id``.
            SessionAlreadyOwnedError: ``mode="write"`` and another lease is live.
        """
        if mode == "read":
            text = await self._run_again(partial(pg.header, sid=session_id), sid=session_id)
            return _PgReadHandle(self, session_id, load_header(text, session_id))
        claim = self._claim()
        epoch, count, text = await self._run_again(
            partial(pg.acquire, sid=session_id, claim=claim, header=None), sid=session_id
        )
        try:
            header = load_header(text, session_id)
        except StoreError:  # corrupt: give the lease just taken back
            release = partial(
                pg.release, sid=session_id, token=claim.token, epoch=epoch, drop_if_empty=False
            )
            with (  # best effort: the corruption is what is reported
                trio.CancelScope(shield=True),
                trio.move_on_after(_RELEASE_GRACE),
                contextlib.suppress(StoreError),
            ):
                await self._run_again(release, sid=session_id)
            raise
        return _PgWriteHandle(self, session_id, header, claim.token, epoch, count)

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (those with at least one stored event), oldest first."""
        return await self._run_again(partial(pg.infos, sid=None))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        infos = await self._run_again(partial(pg.infos, sid=session_id), sid=session_id)
        return infos[0] if infos else None

    async def delete(self, session_id: str) -> None:
        """Delete a session, its events and its lease (a live owner then loses it)."""
        await self._run_again(partial(pg.delete, sid=session_id), sid=session_id)

    async def aclose(self) -> None:
        """Close the pooled connections; the store reconnects if used again."""
        borrowers: list[object] = []
        try:
            for _ in range(_POOL_SIZE):  # holding every token: no thread is using a connection
                borrower = object()
                await self._limiter.acquire_on_behalf_of(borrower)
                borrowers.append(borrower)
            idle, self._idle = self._idle, []
            for conn in idle:
                await trio.to_thread.run_sync(conn.close)
        finally:
            for borrower in borrowers:
                self._limiter.release_on_behalf_of(borrower)


def _worth_retrying(exc: StoreError, *, any_error: bool = False) -> bool:
    """A psycopg failure (wrapped by ``_run``) that a repeat on a new connection may cure."""
    cause = exc.__cause__
    if type(exc) is not StoreError or not isinstance(cause, psycopg.Error):
        return False
    return any_error or pg.retryable(cause)
