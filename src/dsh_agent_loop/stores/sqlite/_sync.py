"""``SqliteStore``'s synchronous side: the schema and every transaction, run in a worker thread.

Nothing here touches trio. Each function is one whole transaction on the connection it is
given (``BEGIN IMMEDIATE`` … ``COMMIT``), so it either happened or did not; when a failure
leaves that unknown, ``settle`` and ``rows_stored`` tell which.

The commit transaction checks ownership and position with one read per handle: the owner
row must still carry the handle's token and the session's last stored seq must be the one
before the handle's first staged event, or the handle inserts nothing. A session's event
count is its last stored seq + 1 (seqs are gapless from 0: every commit checks it), read off
the ``events`` primary key. A commit does not write the summary row (one more page in every
commit's WAL frames cost about a fifth of the transaction), except to record a ``turn/end``.
Files made by the first schema also carry a ``sessions.event_count`` column; it was never kept
up to date, is never read, and its default fills it on insert, so those files open as they are.
``acquire``, ``release`` and ``delete`` are idempotent for the token that runs them, so the
store may repeat them after a failure.

Stored seqs are dense by construction, but the file is not only ours: a row deleted or added
by hand would make the log skip or jump. So ``acquire`` of a stored session and ``header``
count its rows against its last seq (``check_dense``, one walk of the session's keys), and
every read checks that the events it returns count up from its offset (it reads the first
rows from there, as many as it asked for: a gap inside brings in a row from past it;
``_rows.decode_rows``). A break is a ``StoreCorruptError`` naming the session and the first
seq out of place; a claim refused so is rolled back and takes nothing.

An owner row is live while the lock slot it carries is locked (``_owner_lock``), whatever
pid or PID namespace it names; rows without a slot, from an earlier version, are judged by
host, pid and process start time.

Every transaction is rolled back on any exception, not only a database error (a value SQLite
cannot bind, a bug, an injected fault): an open ``BEGIN IMMEDIATE`` holds the file's write lock,
and every other session of the file, in this process or another, would wait behind it. A
stored text that does not decode is a ``StoreError`` with code ``STORE_CORRUPT``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Literal, final

import attrs

from ..._errors import (
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
)
from ..._session.store import SessionInfo
from ...events import Event
from .._rows import (
    LOWEST_SEQ,
    decode_rows,
    escape_surrogates,
    event_json,
    load_header,
    not_dense,
    session_info,
    text_json,
)
from ._owner_lock import OwnerLock

__all__ = [
    "SCHEMA",
    "Claim",
    "Owner",
    "Release",
    "Row",
    "Work",
    "acquire",
    "acquire_many",
    "check_dense",
    "commit",
    "delete",
    "event_row",
    "events",
    "header",
    "infos",
    "is_busy",
    "is_corrupt",
    "migrate",
    "process_start_time",
    "release",
    "release_many",
    "rows_stored",
    "settle",
    "slot_in_use",
]

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    header TEXT NOT NULL,
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
    acquired_at REAL NOT NULL,
    lock_slot INTEGER,
    pid_ns TEXT
);
"""
#: Owner columns added after the first schema: (name, declaration); ``migrate`` adds them.
_LATER_OWNER_COLUMNS: Final = (("lock_slot", "INTEGER"), ("pid_ns", "TEXT"))

#: (owner token, last stored seq) of a session; (None, None) for an unknown one.
_CHECK: Final = (
    "SELECT (SELECT token FROM owners WHERE session_id = ?1),"
    " (SELECT seq FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1)"
)
_TURN_END: Final = "UPDATE sessions SET last_turn_end = ? WHERE session_id = ?"
#: A session's event count (its last seq + 1; 0 without events), as an SQL expression.
_COUNT: Final = (
    "coalesce((SELECT seq + 1 FROM events e WHERE e.session_id = sessions.session_id"
    " ORDER BY seq DESC LIMIT 1), 0)"
)
_INSERT: Final = "INSERT INTO events (session_id, seq, type, json) VALUES (?,?,?,?)"
_RANGE: Final = "SELECT seq, json FROM events WHERE session_id=? AND seq>=? AND seq<? ORDER BY seq"
#: Stored rows from a seq on, at most so many (-1: all): a read (``_rows.decode_rows``).
_FROM: Final = "SELECT json FROM events WHERE session_id=? AND seq>=? ORDER BY seq LIMIT ?"
#: (rows, first seq) of a session: with its last seq, whether its seqs are dense.
_SHAPE: Final = (
    "SELECT (SELECT count(*) FROM events WHERE session_id=?1),"
    " (SELECT seq FROM events WHERE session_id=?1 ORDER BY seq LIMIT 1)"
)
_SEQS: Final = "SELECT seq FROM events WHERE session_id=? ORDER BY seq"
#: A stored session's header, last seq + 1, rows and first seq, in one snapshot.
_HEADER: Final = (
    "SELECT header, (SELECT seq + 1 FROM events WHERE session_id=?1 ORDER BY seq DESC LIMIT 1),"
    " (SELECT count(*) FROM events WHERE session_id=?1),"
    " (SELECT seq FROM events WHERE session_id=?1 ORDER BY seq LIMIT 1)"
    " FROM sessions WHERE session_id=?1"
)
_OWNER: Final = (
    "SELECT token, host, pid, start_time, lock_slot, pid_ns FROM owners WHERE session_id=?"
)
_TAKE: Final = (
    "INSERT OR REPLACE INTO owners"
    " (session_id, token, host, pid, start_time, acquired_at, lock_slot, pid_ns)"
    " VALUES (?,?,?,?,?,?,?,?)"
)
#: SQLITE_BUSY and SQLITE_LOCKED: another connection holds the lock past the busy timeout.
_BUSY_CODES: Final = (5, 6)
#: SQLITE_CORRUPT and SQLITE_NOTADB.
_CORRUPT_CODES: Final = (11, 26)


@final
@attrs.frozen
class Owner:
    """A process as an owner: host, pid and start time (None without ``/proc``)."""

    host: str
    pid: int
    start_time: str | None
    pid_ns: str | None = None
    """The PID namespace the pid means something in (``/proc/self/ns/pid``), for messages."""
    lock: OwnerLock | None = None
    """The store's proof of life (``_owner_lock``); None: rows are judged by pid (tests)."""


Row = tuple[str, int, str, str]
"""An ``events`` row: session id, seq, type, JSON text (``_rows.event_json``)."""


def event_row(session_id: str, event: Event) -> Row:
    """The ``events`` row of ``event`` (encoded on the trio side, before the commit hop)."""
    assert event.seq is not None
    kind = event.type
    return (
        session_id,
        event.seq,
        kind if kind.isascii() else escape_surrogates(kind),
        event_json(event),
    )


@final
@attrs.frozen
class Work:
    """One handle's part of a commit: its staged events, as rows, and where they must go."""

    session_id: str
    token: str
    stored: int
    """The stored event count the handle expects (the first staged seq)."""
    rows: Sequence[Row]
    """The staged events' rows, seqs ``stored ..``."""
    last_turn_end: str | None = None
    """``_rows.last_turn_end`` of the staged events."""


# --- failures -----------------------------------------------------------------------------------


def is_busy(exc: BaseException) -> bool:
    """True for SQLITE_BUSY / SQLITE_LOCKED (extended codes included): worth another try."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _BUSY_CODES


def is_corrupt(exc: BaseException) -> bool:
    """True for SQLITE_CORRUPT / SQLITE_NOTADB: the file is damaged or not a database."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _CORRUPT_CODES


def settle(conn: sqlite3.Connection) -> Literal["rolled-back", "unknown", "broken"]:
    """After a failed transaction: roll back what is still open.

    Returns ``rolled-back`` (nothing of it was committed), ``unknown`` (no transaction was open
    any more: the failure came from ``BEGIN`` or ``COMMIT``, or SQLite rolled back on its own —
    read back to know), or ``broken`` (the connection is unusable; close it, read back on a new
    one).
    """
    try:
        if not conn.in_transaction:
            return "unknown"
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        return "broken"
    return "rolled-back"


def rows_stored(conn: sqlite3.Connection, work: Work) -> bool:
    """Read back after an unknown outcome: True if all of ``work`` is stored, False if none is.

    Raises:
        SequenceConflictError: a part, or different content, is stored at those seqs.
    """
    first = work.stored
    found = conn.execute(_RANGE, (work.session_id, first, first + len(work.rows))).fetchall()
    if not found:
        return False
    wanted = [(row[1], row[3]) for row in work.rows]
    if found == wanted:
        return True
    raise SequenceConflictError(
        f"session {work.session_id!r}: after a failed commit, the stored events differ"
    )


def _roll_back(conn: sqlite3.Connection) -> None:
    """Roll back an open transaction, if any (its lock must not outlive a failure)."""
    with contextlib.suppress(sqlite3.Error):
        if conn.in_transaction:
            conn.execute("ROLLBACK")


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("COMMIT")
    except BaseException:
        _roll_back(conn)
        raise


# --- ownership ------------------------------------------------------------------------------------


def process_start_time(pid: int) -> tuple[bool, str | None]:
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


def _owner_alive(me: Owner, row: Sequence[Any]) -> bool:
    """Judge an ``owners`` row ``(token, host, pid, start_time, lock_slot, pid_ns)``.

    A row with a lock slot is live while its slot is locked (``_owner_lock``), whatever host,
    pid or PID namespace it names; a row without one (an earlier version wrote it) by its pid.
    """
    _, host, pid, start_time, slot, _ = row
    lock = me.lock
    if slot is not None and lock is not None and lock.supported:
        return lock.held(int(slot))
    if host != me.host:
        return True  # no way to check another host: assume alive
    if pid == me.pid:
        return bool(start_time == me.start_time)
    alive, current = process_start_time(pid)
    return alive and (start_time is None or current is None or current == start_time)


def _owned_error(session_id: str, me: Owner, row: Sequence[Any]) -> SessionAlreadyOwnedError:
    _, host, pid, _, _, pid_ns = row
    owner = f"pid {pid} on host {host}"
    if pid_ns is not None and pid_ns != me.pid_ns:
        owner += f" (in another PID namespace, {pid_ns})"
    return SessionAlreadyOwnedError(f"session {session_id!r} is owned by {owner}", owner=owner)


Claim = tuple[str, str, Mapping[str, Any] | None]
"""One ownership claim: session id, owner token, and the header of a session to create (None:
open the stored session)."""


def acquire(
    conn: sqlite3.Connection, sid: str, me: Owner, token: str, header: Mapping[str, Any] | None
) -> tuple[int, str]:
    """Take ownership (create the session when ``header`` is given); return count and header.

    Repeating it with the same ``token`` after an unknown outcome is harmless: an owner row
    that already carries ``token`` is this very claim.
    """
    with _immediate(conn):
        return _claim(conn, me, now=time.time(), sid=sid, token=token, header=header)


def acquire_many(
    conn: sqlite3.Connection, me: Owner, claims: Sequence[Claim]
) -> list[tuple[int, str] | Exception]:
    """``acquire`` for several claims in one transaction, each to its own outcome.

    Each claim runs inside a savepoint: one that is refused (``SessionAlreadyExistsError``,
    ``SessionAlreadyOwnedError``, ``SessionNotFoundError``) or fails for a reason other than a
    database error (a header that cannot be encoded) is rolled back to it and returned as its
    exception; the others commit. A database error aborts the whole transaction and propagates
    (every claim is then untaken, or left to ``settle`` when it came from ``COMMIT``).
    Idempotent per token, like ``acquire``.
    """
    results: list[tuple[int, str] | Exception] = []
    execute, now = conn.execute, time.time()
    with _immediate(conn):
        for sid, token, header in claims:
            execute("SAVEPOINT claim")
            try:
                results.append(_claim(conn, me, now=now, sid=sid, token=token, header=header))
            except sqlite3.Error:
                raise
            except Exception as exc:
                execute("ROLLBACK TO claim")
                results.append(exc)
            execute("RELEASE claim")
    return results


def _claim(
    conn: sqlite3.Connection,
    me: Owner,
    *,
    now: float,
    sid: str,
    token: str,
    header: Mapping[str, Any] | None,
) -> tuple[int, str]:
    """One claim of ``acquire``, inside the caller's transaction (refusals write nothing)."""
    execute = conn.execute
    row = execute(f"SELECT {_COUNT} FROM sessions WHERE session_id=?", (sid,)).fetchone()
    if header is not None and row is not None and row[0] > 0:
        raise SessionAlreadyExistsError(f"session {sid!r} already exists")
    owner = execute(_OWNER, (sid,)).fetchone()
    if owner is not None and owner[0] != token and _owner_alive(me, owner):
        raise _owned_error(sid, me, owner)
    if header is None:
        if row is None or row[0] == 0:
            raise SessionNotFoundError(f"session {sid!r} not found")
        count = int(row[0])
        check_dense(conn, sid, count, *execute(_SHAPE, (sid,)).fetchone())
        header_json = str(
            execute("SELECT header FROM sessions WHERE session_id=?", (sid,)).fetchone()[0]
        )
    else:  # reclaim whatever a never-flushed earlier create left behind
        header_json = text_json(header)
        execute("DELETE FROM events WHERE session_id=?", (sid,))
        if row is not None:
            execute("DELETE FROM sessions WHERE session_id=?", (sid,))
        execute(
            "INSERT INTO sessions (session_id, agent_id, created_at, header) VALUES (?,?,?,?)",
            (
                sid,
                escape_surrogates(str(header.get("agent_id", ""))),
                escape_surrogates(str(header.get("created_at", ""))),
                header_json,
            ),
        )
        count = 0
    slot = None if me.lock is None else me.lock.slot()
    execute(_TAKE, (sid, token, me.host, me.pid, me.start_time, now, slot, me.pid_ns))
    return count, header_json


Release = tuple[str, str, bool]
"""One session's release: session id, owner token, drop the session if it has no event."""


def release(conn: sqlite3.Connection, sid: str, token: str, drop_if_empty: bool) -> None:
    """Give ownership up (and drop the session if it has no stored event)."""
    release_many(conn, [(sid, token, drop_if_empty)])


def release_many(conn: sqlite3.Connection, releases: Sequence[Release]) -> None:
    """Give ownership of several sessions up in one transaction (see ``release``).

    Only an owner row that still carries the releasing token goes, so a row taken over
    meanwhile stays, and repeating a release is harmless.
    """
    execute = conn.execute
    with _immediate(conn):
        for sid, token, drop_if_empty in releases:
            cur = execute("DELETE FROM owners WHERE session_id=? AND token=?", (sid, token))
            if cur.rowcount and drop_if_empty:
                execute(f"DELETE FROM sessions WHERE session_id=? AND {_COUNT}=0", (sid,))


def slot_in_use(conn: sqlite3.Connection, slot: int) -> bool:
    """Whether an owner row carries lock slot ``slot`` (one read, autocommit)."""
    return (
        conn.execute("SELECT 1 FROM owners WHERE lock_slot=? LIMIT 1", (slot,)).fetchone()
        is not None
    )


def delete(conn: sqlite3.Connection, sid: str) -> None:
    """Delete a session, its events and its owner row."""
    with _immediate(conn):
        for table in ("events", "owners", "sessions"):
            conn.execute(f"DELETE FROM {table} WHERE session_id=?", (sid,))


# --- the commit -------------------------------------------------------------------------------


def commit(conn: sqlite3.Connection, work: Sequence[Work]) -> list[Exception | None]:
    """Store several handles' staged events in one transaction; per-handle refusals are returned.

    A refused handle (``SessionOwnershipLostError``, ``SequenceConflictError``) stores nothing;
    the others commit. A database error aborts the whole transaction and propagates, left to
    ``settle`` (it may have come from ``COMMIT``); any other exception is rolled back here and
    propagates. The rows come encoded: the transaction runs nothing but SQL.
    """
    results: list[Exception | None] = []
    execute = conn.execute
    try:
        execute("BEGIN IMMEDIATE")
        for w in work:
            token, last = execute(_CHECK, (w.session_id,)).fetchone()
            if token == w.token and (-1 if last is None else last) == w.stored - 1:
                conn.executemany(_INSERT, w.rows)
                if w.last_turn_end is not None:
                    execute(_TURN_END, (w.last_turn_end, w.session_id))
                results.append(None)
            else:
                results.append(_refusal(w, token, last))
        execute("COMMIT")
    except sqlite3.Error:
        raise
    except BaseException:
        _roll_back(conn)
        raise
    return results


def _refusal(w: Work, token: str | None, last: int | None) -> Exception:
    if token != w.token:
        return SessionOwnershipLostError(f"session {w.session_id!r}: write ownership was lost")
    return SequenceConflictError(
        f"session {w.session_id!r}: {0 if last is None else last + 1} events are stored, "
        f"the handle expected {w.stored}"
    )


# --- reads ------------------------------------------------------------------------------------


def events(conn: sqlite3.Connection, sid: str, start: int, stop: int | None) -> list[Event]:
    """Stored events ``start .. stop`` of one session (one statement: one snapshot).

    Raises:
        StoreCorruptError: the seqs read are not dense (``_rows.decode_rows``).
    """
    low, limit = start or LOWEST_SEQ, -1 if stop is None else stop - start
    rows = conn.execute(_FROM, (sid, low, limit)).fetchall()
    return decode_rows(sid, start, rows)


def header(conn: sqlite3.Connection, sid: str) -> Mapping[str, Any]:
    """The header of a session with stored events, whose seqs are dense.

    Raises:
        SessionNotFoundError: no stored event. StoreCorruptError: see ``check_dense``.
    """
    row = conn.execute(_HEADER, (sid,)).fetchone()
    if row is None or row[1] is None:
        raise SessionNotFoundError(f"session {sid!r} not found")
    check_dense(conn, sid, row[1], row[2], row[3])
    return load_header(row[0], sid)


def check_dense(conn: sqlite3.Connection, sid: str, count: int, rows: int, first: Any) -> None:
    """Check that a session's seqs are ``0 .. count - 1`` (``count``: its last seq + 1).

    ``rows`` and ``first`` are its stored row count and first seq (``_SHAPE``): with integer
    PRIMARY KEY seqs, ``rows == count`` and ``first == 0`` hold exactly when nothing is missing
    or foreign (a seq turned into a fraction keeps the count; reads check the events' own
    seqs). Counting costs a walk of the session's keys (1-3 ms per 10,000 events); finding the
    culprit, only done when corrupt, a second.

    Raises:
        StoreCorruptError: naming the session and the first seq out of place.
    """
    if rows != count or first != 0:
        raise not_dense(sid, (row[0] for row in conn.execute(_SEQS, (sid,))))


def migrate(conn: sqlite3.Connection) -> None:
    """Add the ``owners`` columns a file made by an earlier schema lacks (autocommit).

    Several processes may race to do it: a column another one added meanwhile is fine.
    """
    have = {row[1] for row in conn.execute("PRAGMA table_info(owners)")}
    for name, declaration in _LATER_OWNER_COLUMNS:
        if name not in have:
            try:
                conn.execute(f"ALTER TABLE owners ADD COLUMN {name} {declaration}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):
                    raise


def infos(conn: sqlite3.Connection, sid: str | None) -> list[SessionInfo]:
    """``SessionInfo`` of every stored session (or of ``sid``), oldest first."""
    query = (
        f"SELECT header, {_COUNT} AS n, last_turn_end, session_id FROM sessions"
        " WHERE EXISTS (SELECT 1 FROM events e WHERE e.session_id = sessions.session_id)"
    )
    if sid is None:
        rows = conn.execute(query + " ORDER BY created_at, session_id").fetchall()
    else:
        rows = conn.execute(query + " AND session_id=?", (sid,)).fetchall()
    return [session_info(row) for row in rows]
