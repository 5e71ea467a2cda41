"""``SqliteStore``: every session of a process in one SQLite file, with group commit.

Design. One writer connection per store serves all its sessions, so 10,000 live sessions
hold two descriptors, not 10,000; a second connection serves reads (WAL lets it read while
the writer commits). Every blocking call runs in ``trio.to_thread.run_sync`` under the
store's ``CapacityLimiter``; the file is opened by SQLite only (a plain ``open()`` and
``close()`` of the file would drop the process's POSIX locks on it).

Ownership is an ``owners`` row per session: (host, pid, process start time, random token).
Taking it happens in one ``BEGIN IMMEDIATE`` transaction, so exactly one of several racing
processes wins. An owner whose process is gone, or whose pid now names a process with a
different start time, is dead and is replaced at once; an owner in this same process is
live (two handles on one session conflict here too).

Group commit. Appends are staged on the handle. ``flush`` queues its handle and takes the
writer lock; whoever holds it commits the staged events of every queued handle in one
transaction, checking inside it, per handle, that the owner row still carries the handle's
token. Flushes that queue while a commit runs are therefore committed together by the next
lock holder, and the others find their events already stored. No task is started by the
store: the flushing tasks do the work themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeVar, final, overload

import attrs
import trio

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

__all__ = ["SqliteStore", "SqliteStoreStatistics"]

T = TypeVar("T")

_MAX_THREADS: Final = 4
#: Release after a timed-out close gets this much extra time (best effort).
_RELEASE_GRACE: Final = 1.0

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    header TEXT NOT NULL,
    event_count INTEGER NOT NULL DEFAULT 0,
    last_turn_end TEXT
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS owners (
    session_id TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    start_time TEXT,
    acquired_at REAL NOT NULL
);
"""


@attrs.frozen
class SqliteStoreStatistics:
    """Counters of a ``SqliteStore`` (since it was built)."""

    commits: int
    """Flush transactions committed."""
    handles_committed: int
    """Handle flushes served by those transactions (more than ``commits`` when grouped)."""
    events_committed: int
    """Events stored by them."""


@attrs.frozen
class _Owner:
    host: str
    pid: int
    start_time: str | None


def _process_start_time(pid: int) -> tuple[bool, str | None]:
    """Return (alive, start time) of ``pid``; start time is None without ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False, None
    except OSError:
        return _pid_exists(pid), None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # a zombie has exited; only its parent has not reaped it
        return False, None
    return True, fields[19].decode()


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_alive(me: _Owner, host: str, pid: int, start_time: str | None) -> bool:
    if host != me.host:
        return True  # no way to check another host: assume alive
    if pid == me.pid:
        return start_time == me.start_time
    alive, current = _process_start_time(pid)
    return alive and (start_time is None or current is None or current == start_time)


def _owned_error(session_id: str, host: str, pid: int) -> SessionAlreadyOwnedError:
    owner = f"pid {pid} on host {host}"
    return SessionAlreadyOwnedError(f"session {session_id!r} is owned by {owner}", owner=owner)


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
        event_count=row[1],
        last_turn_end=None if row[2] is None else freeze(json.loads(row[2])),
    )


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# --- synchronous statements (run in a worker thread) ----------------------------------------


def _acquire_sync(
    conn: sqlite3.Connection, sid: str, me: _Owner, token: str, header: Mapping[str, Any] | None
) -> tuple[int, str]:
    """Take ownership (create the session when ``header`` is given); return count and header."""
    with _immediate(conn):
        row = conn.execute("SELECT event_count FROM sessions WHERE session_id=?", (sid,)).fetchone()
        if header is not None and row is not None and row[0] > 0:
            raise SessionAlreadyExistsError(f"session {sid!r} already exists")
        owner = conn.execute(
            "SELECT host, pid, start_time FROM owners WHERE session_id=?", (sid,)
        ).fetchone()
        header_json = "" if header is None else json.dumps(thaw(header), ensure_ascii=False)
        if owner is not None and _owner_alive(me, *owner):
            raise _owned_error(sid, owner[0], owner[1])
        if header is None:
            if row is None or row[0] == 0:
                raise SessionNotFoundError(f"session {sid!r} not found")
            count = int(row[0])
            header_json = conn.execute(
                "SELECT header FROM sessions WHERE session_id=?", (sid,)
            ).fetchone()[0]
        else:  # reclaim whatever a never-flushed earlier create left behind
            conn.execute("DELETE FROM events WHERE session_id=?", (sid,))
            conn.execute("DELETE FROM sessions WHERE session_id=?", (sid,))
            conn.execute(
                "INSERT INTO sessions (session_id, agent_id, created_at, header) VALUES (?,?,?,?)",
                (
                    sid,
                    str(header.get("agent_id", "")),
                    str(header.get("created_at", "")),
                    header_json,
                ),
            )
            count = 0
        conn.execute(
            "INSERT OR REPLACE INTO owners VALUES (?,?,?,?,?,?)",
            (sid, token, me.host, me.pid, me.start_time, time.time()),
        )
    return count, header_json


def _commit_one(conn: sqlite3.Connection, sid: str, token: str, events: list[Event]) -> None:
    """Store one handle's batch inside the running transaction (under a savepoint)."""
    owner = conn.execute("SELECT token FROM owners WHERE session_id=?", (sid,)).fetchone()
    if owner is None or owner[0] != token:
        raise SessionOwnershipLostError(f"session {sid!r}: write ownership was lost")
    conn.execute("SAVEPOINT handle")
    try:
        conn.executemany(
            "INSERT INTO events (session_id, seq, type, json) VALUES (?,?,?,?)",
            [(sid, e.seq, e.type, event_to_json(e)) for e in events],
        )
    except sqlite3.IntegrityError as exc:
        conn.execute("ROLLBACK TO handle")
        raise SequenceConflictError(f"session {sid!r}: seqs already stored ({exc})") from None
    finally:
        conn.execute("RELEASE handle")
    conn.execute(
        "UPDATE sessions SET event_count = event_count + ?,"
        " last_turn_end = coalesce(?, last_turn_end) WHERE session_id=?",
        (len(events), _last_turn_end(events), sid),
    )


def _commit_sync(
    conn: sqlite3.Connection, work: list[tuple[str, str, list[Event]]]
) -> list[Exception | None]:
    """Commit several handles' batches in one transaction; per-handle failures are returned."""
    results: list[Exception | None] = []
    with _immediate(conn):
        for sid, token, events in work:
            try:
                _commit_one(conn, sid, token, events)
            except (SessionOwnershipLostError, SequenceConflictError) as exc:
                results.append(exc)
            else:
                results.append(None)
    return results


def _release_sync(conn: sqlite3.Connection, sid: str, token: str, drop_if_empty: bool) -> None:
    with _immediate(conn):
        cur = conn.execute("DELETE FROM owners WHERE session_id=? AND token=?", (sid, token))
        if cur.rowcount and drop_if_empty:
            conn.execute("DELETE FROM sessions WHERE session_id=? AND event_count=0", (sid,))


def _delete_sync(conn: sqlite3.Connection, sid: str) -> None:
    with _immediate(conn):
        for table in ("events", "owners", "sessions"):
            conn.execute(f"DELETE FROM {table} WHERE session_id=?", (sid,))


def _events_sync(conn: sqlite3.Connection, sid: str, start: int, stop: int | None) -> list[Event]:
    rows = conn.execute(
        "SELECT json FROM events WHERE session_id=? AND seq>=? AND seq<? ORDER BY seq",
        (sid, start, 2**62 if stop is None else stop),
    ).fetchall()
    return [event_from_json(row[0]) for row in rows]


def _header_sync(conn: sqlite3.Connection, sid: str) -> Mapping[str, Any]:
    row = conn.execute(
        "SELECT header FROM sessions WHERE session_id=? AND event_count>0", (sid,)
    ).fetchone()
    if row is None:
        raise SessionNotFoundError(f"session {sid!r} not found")
    return freeze(json.loads(row[0]))  # type: ignore[no-any-return]


def _infos_sync(conn: sqlite3.Connection, sid: str | None) -> list[SessionInfo]:
    query = "SELECT header, event_count, last_turn_end FROM sessions WHERE event_count>0"
    if sid is None:
        rows = conn.execute(query + " ORDER BY created_at, session_id").fetchall()
    else:
        rows = conn.execute(query + " AND session_id=?", (sid,)).fetchall()
    return [_info(row) for row in rows]


# --- handles -----------------------------------------------------------------------------------


def _check_range(offset: int, length: int | None) -> int | None:
    if offset < 0 or (length is not None and length < 0):
        raise ValueError("offset and length must not be negative")
    return None if length is None else offset + length


@attrs.define(eq=False)
class _SqliteReadHandle:
    _store: SqliteStore
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
        return await self._store._on_reader(
            partial(_events_sync, sid=self._session_id, start=offset, stop=stop)
        )

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class _SqliteWriteHandle:
    _store: SqliteStore
    _session_id: str
    _header: Mapping[str, Any]
    _token: str
    _stored_count: int
    _staged: list[Event] = attrs.Factory(list)
    _flush_error: Exception | None = None
    _lost: bool = False
    _closed: bool = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def header(self) -> Mapping[str, Any]:
        return self._header

    @property
    def lease_ttl(self) -> float | None:
        return None

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        stop = _check_range(offset, length)
        stored, staged = self._stored_count, list(self._staged)
        total = stored + len(staged)
        stop = total if stop is None else min(stop, total)
        out: list[Event] = []
        if offset < stored:
            out = await self._store._on_reader(
                partial(_events_sync, sid=self._session_id, start=offset, stop=min(stop, stored))
            )
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
            overlap = await self._store._on_reader(
                partial(_events_sync, sid=self._session_id, start=first, stop=stop)
            )
        else:
            await trio.lowlevel.checkpoint()
        self._check_usable()
        stored = self._stored_count

        def stored_at(seq: int) -> Event:
            if seq < stored:
                assert first is not None
                index = seq - first
                return overlap[index] if 0 <= index < len(overlap) else _MISSING
            return self._staged[seq - stored]

        self._staged.extend(
            new_suffix(self._session_id, stored + len(self._staged), events, stored_at)
        )

    async def flush(self) -> None:
        self._check_usable()
        await self._store._flush(self)

    async def renew(self) -> None:
        self._check_usable()
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        error: Exception | None = None
        deadline = trio.current_time() + self._store._close_timeout
        with trio.CancelScope(shield=True):
            with trio.move_on_at(deadline) as scope:
                try:
                    await self._store._flush(self)
                except Exception as exc:  # raised once ownership is released
                    error = exc
            if scope.cancelled_caught:
                error = StoreError(
                    f"session {self._session_id!r}: close timed out after "
                    f"{self._store._close_timeout}s; {len(self._staged)} unflushed events dropped"
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
        """Drop staged events and the owner row (and the session if nothing was stored).

        Past ``deadline`` it still gets a short grace: releasing is worth a try.
        """
        self._staged.clear()
        self._store._flush_queue.pop(self, None)
        release = partial(
            _release_sync,
            sid=self._session_id,
            token=self._token,
            drop_if_empty=self._stored_count == 0,
        )
        with trio.move_on_at(max(deadline, trio.current_time() + _RELEASE_GRACE)):
            try:
                await self._store._on_writer(release)
            except StoreError as exc:
                return exc
            return None
        return StoreError(f"session {self._session_id!r}: releasing ownership timed out")

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("write handle is closed")
        if self._lost:
            raise SessionOwnershipLostError(
                f"session {self._session_id!r}: write ownership was lost"
            )


_MISSING: Final = Event(type="", seq=-1, time=0.0, data={})


# --- the store ---------------------------------------------------------------------------------


@final
class SqliteStore:
    """Sessions in one SQLite database file (the embedded default backend).

    Args:
        path: The database file; created (with its parent directories) on first use.
        durability: ``"normal"`` (``synchronous=NORMAL``: survives a process crash) or
            ``"full"`` (``synchronous=FULL``: also survives power loss).
        busy_timeout: Seconds to wait for another process's write lock.
        close_timeout: Bound, in seconds, on a write handle's ``close``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 5.0,
        close_timeout: float = 10.0,
    ) -> None:
        if durability not in ("normal", "full"):
            raise ValueError(f"durability must be 'normal' or 'full', not {durability!r}")
        self._path = os.fspath(path)
        self._synchronous = "FULL" if durability == "full" else "NORMAL"
        self._busy_timeout = busy_timeout
        self._close_timeout = close_timeout
        self._limiter = trio.CapacityLimiter(_MAX_THREADS)
        self._writer_lock = trio.Lock()
        self._reader_lock = trio.Lock()
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._me: _Owner | None = None
        self._flush_queue: dict[_SqliteWriteHandle, None] = {}
        self._commits = self._handles_committed = self._events_committed = 0

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def statistics(self) -> SqliteStoreStatistics:
        """Return the store's commit counters."""
        return SqliteStoreStatistics(self._commits, self._handles_committed, self._events_committed)

    # --- connections ---

    def _connect(self) -> sqlite3.Connection:
        parent = os.path.dirname(os.path.abspath(self._path))
        os.makedirs(parent, exist_ok=True)
        conn = sqlite3.connect(
            self._path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _thread(self, fn: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(fn, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite store {self._path!r}: {exc}") from exc

    async def _on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._writer_lock:
            return await self._thread(partial(self._writer_call, fn))

    def _writer_call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._writer is None:
            self._writer = self._connect()
        return fn(self._writer)

    async def _on_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._reader_lock:
            return await self._thread(partial(self._reader_call, fn))

    def _reader_call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._reader is None:
            self._reader = self._connect()
        return fn(self._reader)

    async def _whoami(self) -> _Owner:
        """This process as an owner (host, pid, start time), computed once."""
        if self._me is None:
            pid = os.getpid()
            start_time = await self._thread(lambda: _process_start_time(pid)[1])
            self._me = _Owner(socket.gethostname(), pid, start_time)
        return self._me

    # --- group commit ---

    async def _flush(self, handle: _SqliteWriteHandle) -> None:
        if handle._staged:
            if handle._lost:
                raise SessionOwnershipLostError(
                    f"session {handle._session_id!r}: write ownership was lost"
                )
            self._flush_queue[handle] = None
            async with self._writer_lock:
                error, handle._flush_error = handle._flush_error, None
                if error is None and handle._staged:
                    await self._commit_round(handle)
                    error, handle._flush_error = handle._flush_error, None
            if error is not None:
                raise error
        else:
            await trio.lowlevel.checkpoint()

    async def _commit_round(self, leader: _SqliteWriteHandle) -> None:
        """Commit every queued handle's staged events in one transaction (writer lock held)."""
        self._flush_queue[leader] = None
        batch = [h for h in self._flush_queue if h._staged and not h._lost]
        sizes = [len(h._staged) for h in batch]
        work = [(h._session_id, h._token, h._staged[:n]) for h, n in zip(batch, sizes, strict=True)]
        try:
            results = await self._thread(
                partial(self._writer_call, partial(_commit_sync, work=work))
            )
        except StoreError as exc:
            for handle in batch:
                self._flush_queue.pop(handle, None)
                handle._flush_error = StoreError(exc.message)
            return
        self._commits += 1
        for handle, n, error in zip(batch, sizes, results, strict=True):
            self._flush_queue.pop(handle, None)
            if error is None:
                handle._stored_count += n
                del handle._staged[:n]
                self._handles_committed += 1
                self._events_committed += n
            else:
                handle._lost = handle._lost or isinstance(error, SessionOwnershipLostError)
                handle._flush_error = error

    # --- SessionStore ---

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take write ownership of it.

        Raises:
            SessionAlreadyExistsError: the id has stored events.
            SessionAlreadyOwnedError: a live writer holds the (not yet flushed) id.
        """
        frozen = freeze(dict(header))
        sid = str(frozen["session_id"])
        me, token = await self._whoami(), secrets.token_hex(16)
        await self._on_writer(partial(_acquire_sync, sid=sid, me=me, token=token, header=frozen))
        handle = _SqliteWriteHandle(self, sid, frozen, token, 0)
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
        """Open a stored session for reading, or for writing (taking ownership).

        Raises:
            SessionNotFoundError: no stored event for ``session_id``.
            SessionAlreadyOwnedError: ``mode="write"`` and a live writer owns it.
        """
        if mode == "read":
            header = await self._on_reader(partial(_header_sync, sid=session_id))
            return _SqliteReadHandle(self, session_id, header)
        me, token = await self._whoami(), secrets.token_hex(16)
        count, header_json = await self._on_writer(
            partial(_acquire_sync, sid=session_id, me=me, token=token, header=None)
        )
        header = freeze(json.loads(header_json))
        return _SqliteWriteHandle(self, session_id, header, token, count)

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (those with at least one stored event), oldest first."""
        return await self._on_reader(partial(_infos_sync, sid=None))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        infos = await self._on_reader(partial(_infos_sync, sid=session_id))
        return infos[0] if infos else None

    async def delete(self, session_id: str) -> None:
        """Delete a session, its events and its owner row (a live owner then loses it)."""
        await self._on_writer(partial(_delete_sync, sid=session_id))

    async def aclose(self) -> None:
        """Close the connections; the store reconnects if used again."""
        async with self._writer_lock, self._reader_lock:
            conns = [c for c in (self._writer, self._reader) if c is not None]
            self._writer = self._reader = None
            for conn in conns:
                await self._thread(conn.close)
