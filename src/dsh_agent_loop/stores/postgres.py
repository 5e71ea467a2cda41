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
store opens lazily. Each thread call is one whole transaction: none stays open across an
await. Events carry a sha256 of their JSON; if the connection fails after ``COMMIT`` was sent,
the outcome is settled by reading the (session, seq) rows back on a fresh connection and
comparing those hashes, never by sending the batch again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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
from psycopg.rows import TupleRow

from .._frozen import freeze, thaw
from ..errors import (
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreError,
)
from ..events import TURN_END, Event, event_from_json, event_to_json
from ..session.store import ReadHandle, SessionInfo, WriteHandle
from ._check import new_suffix

__all__ = ["PostgresStore"]

T = TypeVar("T")
Conn = psycopg.Connection[TupleRow]

_POOL_SIZE: Final = 4
#: Releasing after a timed-out close gets this much extra time (best effort).
_RELEASE_GRACE: Final = 1.0
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def _commit(conn: Conn) -> None:
    """Commit ``conn``'s transaction (kept apart so tests can lose the acknowledgement)."""
    conn.commit()


class _AmbiguousCommitError(Exception):
    """The connection failed after COMMIT was sent: the outcome is unknown."""


@attrs.frozen
class _Sql:
    """The statements, with the table prefix filled in."""

    schema: tuple[str, ...]
    lease_seed: str
    lease_lock: str
    lease_take: str
    lease_check: str
    lease_renew: str
    lease_release: str
    lease_delete: str
    session_lock: str
    session_insert: str
    session_delete: str
    session_delete_empty: str
    session_summary: str
    session_header: str
    session_infos: str
    events_insert: str
    events_range: str
    events_hashes: str
    events_delete: str

    @classmethod
    def build(cls, p: str) -> _Sql:
        s, e, le = f"{p}sessions", f"{p}events", f"{p}leases"
        live = "expires_at > clock_timestamp()"
        return cls(
            schema=(
                f"CREATE TABLE IF NOT EXISTS {s} (session_id text PRIMARY KEY,"
                " agent_id text NOT NULL, created_at text NOT NULL, header text NOT NULL,"
                " event_count bigint NOT NULL DEFAULT 0, last_turn_end text)",
                f"CREATE TABLE IF NOT EXISTS {e} (session_id text NOT NULL, seq bigint NOT NULL,"
                " type text NOT NULL, json text NOT NULL, hash bytea NOT NULL,"
                " PRIMARY KEY (session_id, seq))",
                f"CREATE TABLE IF NOT EXISTS {le} (session_id text PRIMARY KEY,"
                " owner_token text NOT NULL, epoch bigint NOT NULL, host text NOT NULL,"
                " pid bigint NOT NULL, expires_at timestamptz NOT NULL)",
            ),
            lease_seed=f"INSERT INTO {le} VALUES (%s, '', 0, '', 0, '-infinity')"
            " ON CONFLICT DO NOTHING",
            lease_lock=f"SELECT owner_token, epoch, host, pid, {live} FROM {le}"
            " WHERE session_id=%s FOR UPDATE",
            lease_take=f"UPDATE {le} SET owner_token=%s, epoch=%s, host=%s, pid=%s,"
            " expires_at = clock_timestamp() + %s * interval '1 second' WHERE session_id=%s",
            lease_check=f"SELECT owner_token, epoch, {live} FROM {le}"
            " WHERE session_id=%s FOR UPDATE",
            lease_renew=f"UPDATE {le} SET expires_at = clock_timestamp() + %s * interval"
            f" '1 second' WHERE session_id=%s AND owner_token=%s AND epoch=%s AND {live}"
            " RETURNING 1",
            lease_release=f"UPDATE {le} SET owner_token='', expires_at='-infinity'"
            " WHERE session_id=%s AND owner_token=%s AND epoch=%s RETURNING 1",
            lease_delete=f"DELETE FROM {le} WHERE session_id=%s",
            session_lock=f"SELECT event_count, header FROM {s} WHERE session_id=%s FOR UPDATE",
            session_insert=f"INSERT INTO {s} (session_id, agent_id, created_at, header)"
            " VALUES (%s, %s, %s, %s)",
            session_delete=f"DELETE FROM {s} WHERE session_id=%s",
            session_delete_empty=f"DELETE FROM {s} WHERE session_id=%s AND event_count=0"
            " RETURNING 1",
            session_summary=f"UPDATE {s} SET event_count = event_count + %s,"
            " last_turn_end = coalesce(%s, last_turn_end) WHERE session_id=%s",
            session_header=f"SELECT header FROM {s} WHERE session_id=%s AND event_count>0",
            session_infos=f"SELECT header, event_count, last_turn_end FROM {s}"
            " WHERE event_count>0 AND (%s::text IS NULL OR session_id=%s)"
            " ORDER BY created_at, session_id",
            events_insert=f"INSERT INTO {e} (session_id, seq, type, json, hash)"
            " VALUES (%s, %s, %s, %s, %s)",
            events_range=f"SELECT json FROM {e} WHERE session_id=%s AND seq>=%s AND seq<%s"
            " ORDER BY seq",
            events_hashes=f"SELECT seq, hash FROM {e} WHERE session_id=%s AND seq>=%s AND seq<%s",
            events_delete=f"DELETE FROM {e} WHERE session_id=%s",
        )


@attrs.frozen
class _Row:
    """One event as stored: seq, type, JSON and its sha256."""

    seq: int
    type: str
    json: str
    hash: bytes

    @classmethod
    def of(cls, event: Event) -> _Row:
        text = event_to_json(event)
        assert event.seq is not None
        return cls(event.seq, event.type, text, hashlib.sha256(text.encode()).digest())


def _last_turn_end(events: Sequence[Event]) -> str | None:
    for event in reversed(events):
        if event.type == TURN_END:
            return json.dumps(thaw(event.data.get("reason")))
    return None


def _info(row: tuple[str, int, str | None]) -> SessionInfo:
    header = json.loads(row[0])
    return SessionInfo(
        session_id=str(header["session_id"]),
        agent_id=str(header.get("agent_id", "")),
        created_at=str(header.get("created_at", "")),
        event_count=int(row[1]),
        last_turn_end=None if row[2] is None else freeze(json.loads(row[2])),
    )


def _lost(sid: str) -> SessionOwnershipLostError:
    return SessionOwnershipLostError(f"session {sid!r}: the write lease was lost")


# --- synchronous transactions (each runs whole in one worker thread) --------------------------


@attrs.frozen
class _Claim:
    """Who asks for a lease."""

    token: str
    host: str
    pid: int
    ttl: float


def _acquire_sync(
    sql: _Sql, conn: Conn, sid: str, claim: _Claim, header: Mapping[str, Any] | None
) -> tuple[int, int, str]:
    """Take the lease (creating the session when ``header`` is given): epoch, count, header."""
    conn.execute(sql.lease_seed, (sid,))
    lease = conn.execute(sql.lease_lock, (sid,)).fetchone()
    session = conn.execute(sql.session_lock, (sid,)).fetchone()
    assert lease is not None
    if header is not None and session is not None and session[0] > 0:
        raise SessionAlreadyExistsError(f"session {sid!r} already exists")
    if lease[0] and lease[4]:
        owner = f"pid {lease[3]} on host {lease[2]}"
        raise SessionAlreadyOwnedError(
            f"session {sid!r} is owned by {owner} (lease epoch {lease[1]})", owner=owner
        )
    if header is None:
        if session is None or session[0] == 0:
            raise SessionNotFoundError(f"session {sid!r} not found")
        count, header_json = int(session[0]), str(session[1])
    else:  # reclaim whatever a never-flushed earlier create left behind
        count, header_json = 0, json.dumps(thaw(header), ensure_ascii=False)
        conn.execute(sql.events_delete, (sid,))
        conn.execute(sql.session_delete, (sid,))
        agent, created = str(header.get("agent_id", "")), str(header.get("created_at", ""))
        conn.execute(sql.session_insert, (sid, agent, created, header_json))
    epoch = int(lease[1]) + 1
    conn.execute(sql.lease_take, (claim.token, epoch, claim.host, claim.pid, claim.ttl, sid))
    conn.commit()
    return epoch, count, header_json


def _flush_sync(
    sql: _Sql, conn: Conn, sid: str, token: str, epoch: int, rows: list[_Row], last: str | None
) -> None:
    """Append ``rows`` if the lease is still ours; a failed COMMIT becomes ambiguous."""
    lease = conn.execute(sql.lease_check, (sid,)).fetchone()
    if lease is None or lease[0] != token or lease[1] != epoch or not lease[2]:
        raise _lost(sid)
    try:
        with conn.cursor() as cur:
            cur.executemany(sql.events_insert, [(sid, r.seq, r.type, r.json, r.hash) for r in rows])
    except psycopg.errors.UniqueViolation:
        raise SequenceConflictError(f"session {sid!r}: seqs already stored") from None
    conn.execute(sql.session_summary, (len(rows), last, sid))
    try:
        _commit(conn)
    except psycopg.Error as exc:
        if exc.sqlstate is not None:
            raise  # the server answered: the transaction definitely failed
        raise _AmbiguousCommitError(str(exc)) from exc


def _resolve_sync(sql: _Sql, conn: Conn, sid: str, rows: list[_Row]) -> bool:
    """After an ambiguous commit: True if all ``rows`` are stored, False if none is."""
    found = conn.execute(sql.events_hashes, (sid, rows[0].seq, rows[-1].seq + 1)).fetchall()
    stored: dict[int, bytes] = {int(seq): bytes(digest) for seq, digest in found}
    if not stored:
        return False
    if all(stored.get(r.seq) == r.hash for r in rows):
        return True
    raise SequenceConflictError(
        f"session {sid!r}: after a lost commit acknowledgement, the stored events differ"
    )


def _renew_sync(sql: _Sql, conn: Conn, sid: str, token: str, epoch: int, ttl: float) -> bool:
    row = conn.execute(sql.lease_renew, (ttl, sid, token, epoch)).fetchone()
    conn.commit()
    return row is not None


def _release_sync(
    sql: _Sql, conn: Conn, sid: str, token: str, epoch: int, drop_if_empty: bool
) -> None:
    released = conn.execute(sql.lease_release, (sid, token, epoch)).fetchone() is not None
    if released and drop_if_empty and conn.execute(sql.session_delete_empty, (sid,)).fetchone():
        conn.execute(sql.lease_delete, (sid,))
    conn.commit()


def _delete_sync(sql: _Sql, conn: Conn, sid: str) -> None:
    for statement in (sql.events_delete, sql.session_delete, sql.lease_delete):
        conn.execute(statement, (sid,))
    conn.commit()


def _events_sync(sql: _Sql, conn: Conn, sid: str, start: int, stop: int | None) -> list[Event]:
    rows = conn.execute(sql.events_range, (sid, start, 2**62 if stop is None else stop))
    return [event_from_json(row[0]) for row in rows.fetchall()]


def _header_sync(sql: _Sql, conn: Conn, sid: str) -> str:
    row = conn.execute(sql.session_header, (sid,)).fetchone()
    if row is None:
        raise SessionNotFoundError(f"session {sid!r} not found")
    return str(row[0])


def _infos_sync(sql: _Sql, conn: Conn, sid: str | None) -> list[SessionInfo]:
    return [_info(row) for row in conn.execute(sql.session_infos, (sid, sid)).fetchall()]


# --- handles -----------------------------------------------------------------------------------


def _check_range(offset: int, length: int | None) -> int | None:
    if offset < 0 or (length is not None and length < 0):
        raise ValueError("offset and length must not be negative")
    return None if length is None else offset + length


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
        stop = _check_range(offset, length)
        return await self._store._run(
            partial(_events_sync, sid=self._session_id, start=offset, stop=stop)
        )

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

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        stop = _check_range(offset, length)
        stored, staged = self._stored_count, list(self._staged)
        total = stored + len(staged)
        stop = total if stop is None else min(stop, total)
        out: list[Event] = []
        if offset < stored:
            fetch = partial(
                _events_sync, sid=self._session_id, start=offset, stop=min(stop, stored)
            )
            out = await self._store._run(fetch)
        else:
            await trio.lowlevel.checkpoint()
        out.extend(staged[max(offset - stored, 0) : max(stop - stored, 0)])
        return out

    async def append(self, events: Sequence[Event]) -> None:
        self._check_usable()
        first = events[0].seq if events else None
        overlap: list[Event] = []
        if first is not None and 0 <= first < self._stored_count:
            stop = min(first + len(events), self._stored_count)
            fetch = partial(_events_sync, sid=self._session_id, start=first, stop=stop)
            overlap = await self._store._run(fetch)
        else:
            await trio.lowlevel.checkpoint()
        self._check_usable()
        stored = self._stored_count
        by_seq = {e.seq: e for e in overlap}

        def stored_at(seq: int) -> Event:
            return by_seq.get(seq, _MISSING) if seq < stored else self._staged[seq - stored]

        self._staged.extend(
            new_suffix(self._session_id, stored + len(self._staged), events, stored_at)
        )

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
        rows = [_Row.of(e) for e in batch]
        txn = partial(
            _flush_sync,
            sid=self._session_id,
            token=self._token,
            epoch=self._epoch,
            rows=rows,
            last=_last_turn_end(batch),
        )
        try:
            await self._store._run(txn)
        except SessionOwnershipLostError as exc:
            self._failure = exc
            raise
        except _AmbiguousCommitError as exc:
            await self._resolve(rows, exc)
        self._stored_count += len(batch)
        del self._staged[: len(batch)]

    async def _resolve(self, rows: list[_Row], cause: _AmbiguousCommitError) -> None:
        """Settle an ambiguous commit by reading back; return only if it did commit."""
        try:
            committed = await self._store._run(
                partial(_resolve_sync, sid=self._session_id, rows=rows), fresh=True
            )
        except StoreError as exc:
            self._failure = StoreError(
                f"session {self._session_id!r}: the outcome of a commit is unknown ({exc})"
            )
            raise self._failure from exc
        if not committed:
            raise StoreError(
                f"session {self._session_id!r}: the connection failed during commit and "
                f"nothing was stored ({cause}); flush again to retry"
            )

    async def renew(self) -> None:
        self._check_usable()
        renew = partial(
            _renew_sync,
            sid=self._session_id,
            token=self._token,
            epoch=self._epoch,
            ttl=self._store.lease_ttl,
        )
        if not await self._store._run(renew):
            self._failure = _lost(self._session_id)
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
            _release_sync,
            sid=self._session_id,
            token=self._token,
            epoch=self._epoch,
            drop_if_empty=self._stored_count == 0,
        )
        with trio.move_on_at(max(deadline, trio.current_time() + _RELEASE_GRACE)):
            try:
                await self._store._run(release)
            except StoreError as exc:
                return exc
            return None
        return StoreError(f"session {self._session_id!r}: releasing the lease timed out")

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("write handle is closed")
        if isinstance(self._failure, SessionOwnershipLostError):
            raise self._failure


_MISSING: Final = Event(type="", seq=-1, time=0.0, data={})


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
    """

    def __init__(
        self,
        dsn: str,
        *,
        lease_ttl: float = 30.0,
        close_timeout: float = 10.0,
        table_prefix: str = "dsh_",
    ) -> None:
        if not _PREFIX.fullmatch(table_prefix):
            raise ValueError(f"table_prefix must match [a-z_][a-z0-9_]*, not {table_prefix!r}")
        if lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive")
        self._dsn = dsn
        self._lease_ttl = float(lease_ttl)
        self._close_timeout = close_timeout
        self._prefix = table_prefix
        self._sql = _Sql.build(table_prefix)
        self._limiter = trio.CapacityLimiter(_POOL_SIZE)
        self._idle: list[Conn] = []
        self._schema_ready = False

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def lease_ttl(self) -> float:
        """Seconds a write lease lasts; the session writer renews every third of it."""
        return self._lease_ttl

    # --- connections ---

    def _connect(self) -> Conn:
        conn = psycopg.connect(self._dsn, autocommit=False, connect_timeout=10)
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

    def _call(self, fn: Callable[[_Sql, Conn], T], fresh: bool) -> T:
        """Run ``fn`` on a pooled (or, with ``fresh``, a new) connection, in a worker thread."""
        conn: Conn | None = None
        if not fresh:
            with contextlib.suppress(IndexError):
                conn = self._idle.pop()  # atomic: worker threads share the list
        if conn is None:
            conn = self._connect()
        try:
            return fn(self._sql, conn)
        finally:
            self._checkin(conn)

    def _checkin(self, conn: Conn) -> None:
        if not conn.closed and not conn.broken:
            try:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
            except psycopg.Error:
                pass
            else:
                self._idle.append(conn)
                return
        conn.close()

    async def _run(self, fn: Callable[[_Sql, Conn], T], *, fresh: bool = False) -> T:
        try:
            return await trio.to_thread.run_sync(self._call, fn, fresh, limiter=self._limiter)
        except psycopg.Error as exc:
            raise StoreError(f"postgres store: {exc}") from exc

    def _claim(self) -> _Claim:
        return _Claim(secrets.token_hex(16), socket.gethostname(), os.getpid(), self._lease_ttl)

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
        epoch, _, _ = await self._run(partial(_acquire_sync, sid=sid, claim=claim, header=frozen))
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
            text = await self._run(partial(_header_sync, sid=session_id))
            return _PgReadHandle(self, session_id, freeze(json.loads(text)))
        claim = self._claim()
        epoch, count, text = await self._run(
            partial(_acquire_sync, sid=session_id, claim=claim, header=None)
        )
        header = freeze(json.loads(text))
        return _PgWriteHandle(self, session_id, header, claim.token, epoch, count)

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (those with at least one stored event), oldest first."""
        return await self._run(partial(_infos_sync, sid=None))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        infos = await self._run(partial(_infos_sync, sid=session_id))
        return infos[0] if infos else None

    async def delete(self, session_id: str) -> None:
        """Delete a session, its events and its lease (a live owner then loses it)."""
        await self._run(partial(_delete_sync, sid=session_id))

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
