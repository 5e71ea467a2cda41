"""``PostgresStore``'s synchronous side: the statements and each transaction, in a worker thread.

Nothing here touches trio; each function is one whole transaction on the connection it is
given, committed (or, on any exception, rolled back when the connection goes back to the
pool). ``flush`` sorts its failures for the store: ``RetryableError`` (nothing was stored, and
trying again may work: a lost connection before ``COMMIT``, a serialization failure, a
deadlock, a lock not available), ``AmbiguousCommitError`` (the connection failed after
``COMMIT`` was sent: ``resolve`` reads the outcome back under the lease row's lock), or the
database error itself (nothing was stored, and trying again will not help).

A lost connection is an error without an SQLSTATE (the server never answered), one of class
08 (connection exception), or the server ending the session: ``57P01`` admin shutdown (also
what ``pg_terminate_backend`` sends), ``57P02`` crash shutdown, ``57P03`` cannot connect now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs
import psycopg
from psycopg.rows import TupleRow

from .._errors import (
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
)
from .._session.store import SessionInfo
from ..events import Event
from ._rows import (
    LOWEST_SEQ,
    decode_rows,
    escape_surrogates,
    event_json,
    event_sha256,
    not_dense,
    session_info,
    text_json,
)

__all__ = [
    "TRANSIENT",
    "AmbiguousCommitError",
    "Claim",
    "Conn",
    "RetryableError",
    "Row",
    "Sql",
    "acquire",
    "check_dense",
    "commit",
    "connection_lost",
    "delete",
    "events",
    "flush",
    "header",
    "infos",
    "lost",
    "release",
    "renew",
    "resolve",
    "retryable",
]

Conn = psycopg.Connection[TupleRow]


def commit(conn: Conn) -> None:
    """Commit ``conn``'s transaction (kept apart so tests can lose the acknowledgement)."""
    conn.commit()


@final
class AmbiguousCommitError(Exception):
    """The connection failed after COMMIT was sent: the outcome is unknown."""


@final
class RetryableError(Exception):
    """The transaction failed and stored nothing, for a reason that may pass (see below)."""


#: SQLSTATEs worth another try: serialization failure, deadlock, lock not available.
TRANSIENT: Final = frozenset({"40001", "40P01", "55P03"})
#: SQLSTATEs of a server that ended the session: admin shutdown (``pg_terminate_backend``),
#: crash shutdown, cannot connect now (starting up or shutting down).
_GONE: Final = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(exc: psycopg.Error) -> bool:
    """The connection is gone: no SQLSTATE (no answer), class 08, or the server ended it."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _GONE


def retryable(exc: psycopg.Error) -> bool:
    """Worth another try on a new connection: a lost connection, or a transient failure."""
    return connection_lost(exc) or exc.sqlstate in TRANSIENT


@final
@attrs.frozen
class Sql:
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
    events_shape: str
    events_seqs: str
    session_infos: str
    events_insert: str
    events_range: str
    events_hashes: str
    events_delete: str

    @classmethod
    def build(cls, p: str) -> Sql:
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
            session_header=f"SELECT header, event_count, shape.* FROM {s}, LATERAL"
            f" (SELECT count(*), min(seq), max(seq) FROM {e} WHERE session_id=%(sid)s) shape"
            " WHERE session_id=%(sid)s AND event_count>0",
            events_shape=f"SELECT count(*), min(seq), max(seq) FROM {e} WHERE session_id=%s",
            events_seqs=f"SELECT seq FROM {e} WHERE session_id=%s ORDER BY seq",
            session_infos=f"SELECT header, event_count, last_turn_end, session_id FROM {s}"
            " WHERE event_count>0 AND (%s::text IS NULL OR session_id=%s)"
            " ORDER BY created_at, session_id",
            events_insert=f"INSERT INTO {e} (session_id, seq, type, json, hash)"
            " VALUES (%s, %s, %s, %s, %s)",
            events_range=f"SELECT json FROM {e} WHERE session_id=%s AND seq>=%s"
            " ORDER BY seq LIMIT %s",
            events_hashes=f"SELECT seq, hash FROM {e} WHERE session_id=%s AND seq>=%s AND seq<%s",
            events_delete=f"DELETE FROM {e} WHERE session_id=%s",
        )


@final
@attrs.frozen
class Row:
    """One event as stored: seq, type, JSON and its sha256."""

    seq: int
    type: str
    json: str
    hash: bytes

    @classmethod
    def of(cls, event: Event) -> Row:
        text, kind = event_json(event), event.type
        assert event.seq is not None
        kind = kind if kind.isascii() else escape_surrogates(kind)
        return cls(event.seq, kind, text, event_sha256(text))


def lost(sid: str) -> SessionOwnershipLostError:
    return SessionOwnershipLostError(f"session {sid!r}: the write lease was lost")


# --- synchronous transactions (each runs whole in one worker thread) --------------------------


@final
@attrs.frozen
class Claim:
    """Who asks for a lease."""

    token: str
    host: str
    pid: int
    ttl: float


def acquire(
    sql: Sql, conn: Conn, sid: str, claim: Claim, header: Mapping[str, Any] | None
) -> tuple[int, int, str]:
    """Take the lease (creating the session when ``header`` is given): epoch, count, header."""
    conn.execute(sql.lease_seed, (sid,))
    lease = conn.execute(sql.lease_lock, (sid,)).fetchone()
    session = conn.execute(sql.session_lock, (sid,)).fetchone()
    assert lease is not None
    if header is not None and session is not None and session[0] > 0:
        raise SessionAlreadyExistsError(f"session {sid!r} already exists")
    if lease[0] and lease[4] and lease[0] != claim.token:
        owner = f"pid {lease[3]} on host {lease[2]}"
        raise SessionAlreadyOwnedError(
            f"session {sid!r} is owned by {owner} (lease epoch {lease[1]})", owner=owner
        )
    if header is None:
        if session is None or session[0] == 0:
            raise SessionNotFoundError(f"session {sid!r} not found")
        count, header_json = int(session[0]), str(session[1])
        shape = conn.execute(sql.events_shape, (sid,)).fetchone()
        assert shape is not None  # (an aggregate: always one row)
        check_dense(sql, conn, sid, count, *shape)
    else:  # reclaim whatever a never-flushed earlier create left behind
        count, header_json = 0, text_json(header)
        conn.execute(sql.events_delete, (sid,))
        conn.execute(sql.session_delete, (sid,))
        agent = escape_surrogates(str(header.get("agent_id", "")))
        created = escape_surrogates(str(header.get("created_at", "")))
        conn.execute(sql.session_insert, (sid, agent, created, header_json))
    epoch = int(lease[1]) + 1
    conn.execute(sql.lease_take, (claim.token, epoch, claim.host, claim.pid, claim.ttl, sid))
    conn.commit()
    return epoch, count, header_json


def flush(
    sql: Sql, conn: Conn, sid: str, token: str, epoch: int, rows: list[Row], last: str | None
) -> None:
    """Append ``rows`` if the lease is still ours; a failed COMMIT becomes ambiguous."""
    try:
        lease = conn.execute(sql.lease_check, (sid,)).fetchone()
        if lease is None or lease[0] != token or lease[1] != epoch or not lease[2]:
            raise lost(sid)
        with conn.cursor() as cur:
            cur.executemany(sql.events_insert, [(sid, r.seq, r.type, r.json, r.hash) for r in rows])
        conn.execute(sql.session_summary, (len(rows), last, sid))
    except psycopg.errors.UniqueViolation:
        raise SequenceConflictError(f"session {sid!r}: seqs already stored") from None
    except psycopg.Error as exc:  # before COMMIT: nothing was stored
        if retryable(exc):
            raise RetryableError(str(exc)) from exc
        raise
    try:
        commit(conn)
    except psycopg.Error as exc:
        if connection_lost(exc):
            raise AmbiguousCommitError(str(exc)) from exc
        if exc.sqlstate in TRANSIENT:  # the server answered: it definitely failed
            raise RetryableError(str(exc)) from exc
        raise


def resolve(sql: Sql, conn: Conn, sid: str, rows: list[Row]) -> bool:
    """After an ambiguous commit: True if all ``rows`` are stored, False if none is.

    The lease row is locked first: a COMMIT still in flight on the lost connection holds that
    lock until the server has settled it, so what is read afterwards is final.
    """
    conn.execute("SET LOCAL lock_timeout = '10s'")
    conn.execute(sql.lease_check, (sid,))
    found = conn.execute(sql.events_hashes, (sid, rows[0].seq, rows[-1].seq + 1)).fetchall()
    conn.rollback()
    stored: dict[int, bytes] = {int(seq): bytes(digest) for seq, digest in found}
    if not stored:
        return False
    if all(stored.get(r.seq) == r.hash for r in rows):
        return True
    raise SequenceConflictError(
        f"session {sid!r}: after a lost commit acknowledgement, the stored events differ"
    )


def renew(sql: Sql, conn: Conn, sid: str, token: str, epoch: int, ttl: float) -> bool:
    row = conn.execute(sql.lease_renew, (ttl, sid, token, epoch)).fetchone()
    conn.commit()
    return row is not None


def release(sql: Sql, conn: Conn, sid: str, token: str, epoch: int, drop_if_empty: bool) -> None:
    released = conn.execute(sql.lease_release, (sid, token, epoch)).fetchone() is not None
    if released and drop_if_empty and conn.execute(sql.session_delete_empty, (sid,)).fetchone():
        conn.execute(sql.lease_delete, (sid,))
    conn.commit()


def delete(sql: Sql, conn: Conn, sid: str) -> None:
    for statement in (sql.events_delete, sql.session_delete, sql.lease_delete):
        conn.execute(statement, (sid,))
    conn.commit()


def events(sql: Sql, conn: Conn, sid: str, start: int, stop: int | None) -> list[Event]:
    """Stored events ``start .. stop`` (one statement: one snapshot).

    Raises:
        StoreCorruptError: the seqs read are not dense (``_rows.decode_rows``).
    """
    low, limit = start or LOWEST_SEQ, None if stop is None else stop - start
    rows = conn.execute(sql.events_range, (sid, low, limit)).fetchall()
    return decode_rows(sid, start, rows)


def header(sql: Sql, conn: Conn, sid: str) -> str:
    """The stored header text of a session with stored events, whose seqs are dense.

    Raises:
        SessionNotFoundError: no stored event. StoreCorruptError: see ``check_dense``.
    """
    row = conn.execute(sql.session_header, {"sid": sid}).fetchone()
    if row is None:
        raise SessionNotFoundError(f"session {sid!r} not found")
    check_dense(sql, conn, sid, int(row[1]), *row[2:])
    return str(row[0])


def check_dense(
    sql: Sql, conn: Conn, sid: str, count: int, rows: int, first: Any, last: Any
) -> None:
    """Check that a session's seqs are ``0 .. count - 1`` (``count``: its summary row's).

    ``rows``, ``first`` and ``last`` are its stored row count, first and last seq (one walk
    of its keys): ``count`` distinct integers from 0 to ``count - 1`` are exactly those.
    Finding the culprit, only done when corrupt, reads the seqs.

    Raises:
        StoreCorruptError: naming the session and the first seq out of place.
    """
    if rows != count or first != 0 or last != count - 1:
        raise not_dense(sid, (row[0] for row in conn.execute(sql.events_seqs, (sid,))))


def infos(sql: Sql, conn: Conn, sid: str | None) -> list[SessionInfo]:
    return [session_info(row) for row in conn.execute(sql.session_infos, (sid, sid)).fetchall()]
