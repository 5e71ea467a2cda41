"""``PostgresStore``: sessions in PostgreSQL, shared by many processes and machines.

Design. Ownership is a lease row (session_id, owner token, epoch, host, pid, expires_at),
taken in one transaction that locks the row, and checked again, ``FOR UPDATE``, inside every
append transaction: the token, the epoch and the expiry (by the database clock) must all
still match. A paused owner that wakes up after its lease expired and another process took
over (epoch + 1) is therefore rejected with ``SessionOwnershipLostError`` instead of writing
(a lock alone cannot fence it). Taking over needs the lease to have expired; the session
writer calls ``renew`` every ``lease_ttl / 3`` to keep it.

Connections are a small lazy pool, one worker thread per transaction (``_postgres_pool``);
the transactions are in ``_postgres_sync``; write handles are the shared staged handles
(``_handles``), whose backend here is ``_PgBackend``. Events carry a sha256 of their JSON;
if the connection fails after ``COMMIT`` was sent, the outcome is settled by reading the
(session, seq) rows back on a fresh connection, under the lease row's lock, and comparing
those hashes — never by sending the batch blindly again. Once nothing is known to be
stored, a flush that failed for a reason that may pass (a lost connection, a serialization
failure, a deadlock, a lock not available) is tried again a few times on a fresh connection;
idempotent transactions (reads, lease acquisition, renewal, release) likewise. Other errors
(disk full) fail the flush.

Reconnecting. A lost connection (no SQLSTATE, class 08, or the server ending the session:
``57P01`` as ``pg_terminate_backend`` sends, ``57P02``, ``57P03`` while it restarts) is retried
on a new connection after each of ``retry_delays`` (capped exponential by default, about 6.5 s
in all); past them the call raises ``StoreError``. Nothing is re-checked on reconnect: the
retried transaction checks the lease (token, epoch, expiry) itself, so a session taken over
while this process was cut off raises ``SessionOwnershipLostError`` and writes nothing, and
a retried batch is neither lost nor duplicated (a lost ``COMMIT`` is read back first).
Every failure of a store method is a ``StoreError``: psycopg's, and any other (a value the
driver cannot send, stored text that does not decode), with its cause chained.

Corrupt data. A session's seqs are dense from 0 by construction, but rows deleted, added or
renumbered by hand break that. ``open`` (read or write) compares the summary row's event count
with the rows' count, first and last seq in one statement, and every read checks that the
events it returns count up from its offset (``_rows.decode_rows``): a break is a
``StoreCorruptError`` naming the session and the first seq out of place. A write open refused
so is rolled back: it takes no lease.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, final, overload

import psycopg
import trio

from .._errors import SessionOwnershipLostError, StoreError
from .._frozen import freeze
from .._session.store import ReadHandle, SessionInfo, StoreStatistics, WriteHandle
from ..events import Event
from . import _postgres_sync as pg
from ._handles import RELEASE_GRACE, StagedWriteHandle, Staging, StoreReadHandle
from ._postgres_pool import Pool, worth_retrying
from ._rows import last_turn_end, load_header

__all__ = ["PostgresStore"]

_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,40}")

_PgStaging = Staging[pg.Row]


def capped_backoff(first: float, cap: float, count: int) -> tuple[float, ...]:
    """``count`` delays doubling from ``first``, each at most ``cap``."""
    return tuple(min(first * 2**i, cap) for i in range(count))


#: Seconds to wait before each repeat of a call that failed and may work on a new connection.
RETRY_DELAYS: Final = capped_backoff(0.02, 2.0, 9)


@final
class _PgBackend:
    """What ``PostgresStore``'s write handles call (``StagingBackend``), and its counters."""

    def __init__(self, pool: Pool, lease_ttl: float) -> None:
        self._pool = pool
        self._lease_ttl = lease_ttl
        self.commits = self.events_committed = self.retries = 0

    async def fetch(self, staging: _PgStaging, start: int, stop: int) -> list[Event]:
        """Stored events ``start .. stop`` of the session."""
        sid = staging.session_id
        return await self._pool.run_again(
            partial(pg.events, sid=sid, start=start, stop=stop), sid=sid
        )

    async def flush(self, staging: _PgStaging) -> None:
        """Commit the staged events in one transaction that checks the lease."""
        if not staging.staged:
            await trio.lowlevel.checkpoint()
            return
        staging.check_writable()
        sid = staging.session_id
        count = len(staging.staged)
        rows = staging.pending_rows(pg.Row.of)[:count]
        txn = partial(
            pg.flush,
            sid=sid,
            token=staging.token,
            epoch=staging.epoch,
            rows=rows,
            last=last_turn_end(staging.staged),
        )
        fresh = False
        for delay in (*self._pool.retry_delays, None):
            try:
                await self._pool.run(txn, fresh=fresh, sid=sid)
                break
            except SessionOwnershipLostError as exc:
                staging.fail(exc)
                raise
            except pg.AmbiguousCommitError as exc:
                if await self._resolve(staging, rows):
                    break
                error = StoreError(
                    f"session {sid!r}: the connection failed during commit and "
                    f"nothing was stored ({exc})"
                )
                error.__cause__ = exc.__cause__
            except pg.RetryableError as exc:
                error = StoreError(f"session {sid!r}: nothing was stored ({exc})")
                error.__cause__ = exc.__cause__
            except StoreError as exc:  # connecting failed, or a final error
                if not worth_retrying(exc):
                    raise
                error = exc
            if delay is None:
                raise error
            self.retries += 1
            fresh = True  # nothing was stored: a new connection may do better
            await trio.sleep(delay)
        staging.committed(count)
        self.commits += 1
        self.events_committed += count

    async def _resolve(self, staging: _PgStaging, rows: list[pg.Row]) -> bool:
        """Settle an ambiguous commit by reading back: did it commit?"""
        sid = staging.session_id
        try:
            resolve = partial(pg.resolve, sid=sid, rows=rows)
            return await self._pool.run_again(resolve, fresh=True, sid=sid)
        except StoreError as exc:
            error = StoreError(f"session {sid!r}: the outcome of a commit is unknown ({exc})")
            raise staging.fail(error) from exc

    async def renew(self, staging: _PgStaging) -> None:
        """Extend the lease, if it is still ours."""
        sid = staging.session_id
        renew = partial(
            pg.renew, sid=sid, token=staging.token, epoch=staging.epoch, ttl=self._lease_ttl
        )
        if not await self._pool.run_again(renew, sid=sid):
            raise staging.fail(pg.lost(sid))

    async def release(self, staging: _PgStaging, patience: float) -> None:
        """Give the lease up; remove the session if nothing of it was stored.

        Each release is its own statement: ``patience`` bounds all of it.
        """
        release = partial(
            pg.release,
            sid=staging.session_id,
            token=staging.token,
            epoch=staging.epoch,
            drop_if_empty=staging.stored_count == 0,
        )
        with trio.fail_after(patience):
            await self._pool.run_again(release, any_error=True, sid=staging.session_id)


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
        self._table_prefix = table_prefix
        self._lease_ttl = float(lease_ttl)
        self._close_timeout = close_timeout
        self._pool = Pool(
            dsn,
            prefix=table_prefix,
            connection_class=connection_class,
            retry_delays=retry_delays,
        )
        self._backend = _PgBackend(self._pool, self._lease_ttl)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def dsn(self) -> str:
        """The connection string, as given (the fleet opens its own connections with it)."""
        return self._dsn

    @property
    def table_prefix(self) -> str:
        """The prefix of this store's table names (the fleet's tables share it)."""
        return self._table_prefix

    @property
    def lease_ttl(self) -> float:
        """Seconds a write lease lasts; the session writer renews every third of it."""
        return self._lease_ttl

    def statistics(self) -> StoreStatistics:
        """Return the store's commit counters (every flush is a transaction of its own)."""
        backend = self._backend
        return StoreStatistics(
            commits=backend.commits,
            handles_committed=backend.commits,
            events_committed=backend.events_committed,
            retries=backend.retries + self._pool.retries,
        )

    def _handle(
        self, sid: str, header: Mapping[str, Any], token: str, epoch: int, count: int
    ) -> WriteHandle:
        staging = _PgStaging(sid, token, count, epoch)
        return StagedWriteHandle(
            self._backend, staging, header, self._close_timeout, self._lease_ttl
        )

    async def _read_range(self, sid: str, start: int, stop: int | None) -> list[Event]:
        read = partial(pg.events, sid=sid, start=start, stop=stop)
        return await self._pool.run_again(read, sid=sid)

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
        frozen = freeze(header)
        sid, claim = str(frozen["session_id"]), self._claim()
        epoch, _, _ = await self._pool.run_again(
            partial(pg.acquire, sid=sid, claim=claim, header=frozen), sid=sid
        )
        handle = self._handle(sid, frozen, claim.token, epoch, 0)
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
            StoreCorruptError: stored data of the session is corrupt (seqs not dense: the
                message names the seq; a header that does not decode); nothing is taken.
        """
        if mode == "read":
            text = await self._pool.run_again(partial(pg.header, sid=session_id), sid=session_id)
            header = load_header(text, session_id)
            return StoreReadHandle(session_id, header, partial(self._read_range, session_id))
        claim = self._claim()
        epoch, count, text = await self._pool.run_again(
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
                trio.move_on_after(RELEASE_GRACE),
                contextlib.suppress(StoreError),
            ):
                await self._pool.run_again(release, sid=session_id)
            raise
        return self._handle(session_id, header, claim.token, epoch, count)

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (those with at least one stored event), oldest first."""
        return await self._pool.run_again(partial(pg.infos, sid=None))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        infos = await self._pool.run_again(partial(pg.infos, sid=session_id), sid=session_id)
        return infos[0] if infos else None

    async def delete(self, session_id: str) -> None:
        """Delete a session, its events and its lease (a live owner then loses it)."""
        await self._pool.run_again(partial(pg.delete, sid=session_id), sid=session_id)

    async def aclose(self) -> None:
        """Close the pooled connections; the store reconnects if used again."""
        await self._pool.aclose()
