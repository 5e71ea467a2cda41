"""The fleet's tables and each of its transactions, written once for SQLite and PostgreSQL.

Nothing here touches trio: every function is one whole transaction on the ``Tx`` it is given
(``_db`` runs it in a worker thread and commits it, or rolls it back on any exception). The SQL
is written with ``?`` placeholders; the PostgreSQL side rewrites them to ``%s``
(docs/design.md#fleet-tables).

Tables (names after the store's prefix, so the fleet and the store of one database stay apart
from other applications' tables):

- ``fleet_workers``: one row per running worker, its heartbeat and live agent count.
- ``fleet_sessions``: one row per session the fleet knows: the worker it is assigned to (NULL:
  nobody), the per-session counter that orders its messages and commands, and ``not_before``
  (a claim that failed waits until then).
- ``fleet_messages``: accepted messages, ``n`` their place in the session's order, unique per
  ``(session_id, message_id)`` (a repeated ``message_id`` is the same message);
  ``delivered_at`` is set once the message's splice is stored in the session's log.
- ``fleet_commands``: create, cancel, approve and deny, in the same order as messages;
  ``done_at`` and ``error`` once a worker applied them.

Times are seconds since the epoch from the caller's clock (``time.time()``); a worker is live
while its heartbeat is younger than the fleet's lease. That judgement only chooses which worker
tries a session next: writing to a session still needs the store's own ownership, whose lease
(PostgreSQL) is fenced by epoch on the database clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, Protocol, final

import attrs

__all__ = [
    "Item",
    "Taken",
    "Tx",
    "WorkerRow",
    "schema",
]


class Tx(Protocol):
    """One open transaction: the few calls the functions below make."""

    dialect: str
    """``sqlite`` or ``postgresql``."""

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` and return every row."""
        ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run ``sql``; return the number of rows it changed."""
        ...


def schema(prefix: str) -> list[str]:
    """The statements that create the fleet's tables (each ``IF NOT EXISTS``)."""
    p = prefix
    return [
        f"CREATE TABLE IF NOT EXISTS {p}fleet_workers (worker_id TEXT PRIMARY KEY,"
        " host TEXT NOT NULL, pid BIGINT NOT NULL, started_at DOUBLE PRECISION NOT NULL,"
        " heartbeat_at DOUBLE PRECISION NOT NULL, live_agents BIGINT NOT NULL DEFAULT 0,"
        " max_agents BIGINT NOT NULL, state TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {p}fleet_sessions (session_id TEXT PRIMARY KEY,"
        " worker_id TEXT, next_n BIGINT NOT NULL DEFAULT 0,"
        " not_before DOUBLE PRECISION NOT NULL DEFAULT 0)",
        f"CREATE INDEX IF NOT EXISTS {p}fleet_sessions_worker ON {p}fleet_sessions (worker_id)",
        f"CREATE TABLE IF NOT EXISTS {p}fleet_messages (session_id TEXT NOT NULL,"
        " n BIGINT NOT NULL, message_id TEXT NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,"
        " sent_at DOUBLE PRECISION NOT NULL, delivered_at DOUBLE PRECISION,"
        " PRIMARY KEY (session_id, n), UNIQUE (session_id, message_id))",
        f"CREATE INDEX IF NOT EXISTS {p}fleet_messages_waiting ON {p}fleet_messages"
        " (session_id, n) WHERE delivered_at IS NULL",
        f"CREATE TABLE IF NOT EXISTS {p}fleet_commands (session_id TEXT NOT NULL,"
        " n BIGINT NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,"
        " sent_at DOUBLE PRECISION NOT NULL, done_at DOUBLE PRECISION, error TEXT,"
        " PRIMARY KEY (session_id, n))",
        f"CREATE INDEX IF NOT EXISTS {p}fleet_commands_waiting ON {p}fleet_commands"
        " (session_id, n) WHERE done_at IS NULL",
    ]


def create_tables(tx: Tx, p: str) -> None:
    """Create the tables (on PostgreSQL under an advisory lock: racing creations collide)."""
    if tx.dialect == "postgresql":
        tx.all("SELECT pg_advisory_xact_lock(hashtext(?))", (f"{p}fleet",))
    for statement in schema(p):
        tx.run(statement)


#: Message kinds (``send``'s ``kind``) and command kinds.
MESSAGE_KINDS: Final = ("followup", "steer", "inject")
COMMAND_KINDS: Final = ("create", "cancel", "approve", "deny", "withdraw")


@final
@attrs.frozen
class Item:
    """One undelivered message or undone command of a session, in the session's order."""

    session_id: str
    n: int
    kind: str
    """A message kind (``followup``/``steer``/``inject``) or a command kind."""
    body: Any
    """The message record (``message_id``, ``content``, ``output``) or the command's arguments."""

    @property
    def is_message(self) -> bool:
        """A message (not a command)."""
        return self.kind in MESSAGE_KINDS


@final
@attrs.frozen
class WorkerRow:
    """A ``fleet_workers`` row."""

    worker_id: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    live_agents: int
    max_agents: int
    state: str


# --- clients -----------------------------------------------------------------------------------


def known(tx: Tx, p: str, sid: str) -> bool:
    """True when the fleet has a row for ``sid``."""
    return bool(tx.all(f"SELECT 1 FROM {p}fleet_sessions WHERE session_id = ?", (sid,)))


def _next_n(tx: Tx, p: str, sid: str) -> int:
    """Take the session's next number (the row lock orders concurrent senders)."""
    tx.run(f"INSERT INTO {p}fleet_sessions (session_id) VALUES (?) ON CONFLICT DO NOTHING", (sid,))
    rows = tx.all(
        f"UPDATE {p}fleet_sessions SET next_n = next_n + 1 WHERE session_id = ? RETURNING next_n",
        (sid,),
    )
    return int(rows[0][0])


def send(tx: Tx, p: str, sid: str, message_id: str, kind: str, body: str, now: float) -> bool:
    """Accept a message; False when ``message_id`` was accepted before (nothing changes).

    On PostgreSQL one statement: the upsert of the session row takes the next number under the
    row's lock, then the message goes in (a repeated id conflicts and changes nothing but the
    counter, which only orders); the ``NOTIFY`` wakes the workers once it commits.
    """
    if tx.dialect == "postgresql":
        rows = tx.all(
            f"WITH s AS (INSERT INTO {p}fleet_sessions AS f (session_id, next_n) VALUES (?, 1)"
            " ON CONFLICT (session_id) DO UPDATE SET next_n = f.next_n + 1 RETURNING next_n)"
            f" INSERT INTO {p}fleet_messages (session_id, n, message_id, kind, body, sent_at)"
            " SELECT ?, s.next_n, ?, ?, ?, ? FROM s ON CONFLICT DO NOTHING RETURNING n",
            (sid, sid, message_id, kind, body, now),
        )
        tx.run(f"NOTIFY {p}fleet")
        return bool(rows)
    seen = f"SELECT 1 FROM {p}fleet_messages WHERE session_id = ? AND message_id = ?"
    if tx.all(seen, (sid, message_id)):
        return False
    n = _next_n(tx, p, sid)  # locks the session row: a racing twin waits, then sees ours
    inserted = tx.run(
        f"INSERT INTO {p}fleet_messages (session_id, n, message_id, kind, body, sent_at)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (sid, n, message_id, kind, body, now),
    )
    return inserted > 0


def send_many(tx: Tx, p: str, rows: Sequence[tuple[str, str, str, str]], now: float) -> int:
    """``send`` of many ``(session_id, message_id, kind, body)``, in order, in one transaction."""
    return sum(send(tx, p, sid, mid, kind, body, now) for sid, mid, kind, body in rows)


def create_many(tx: Tx, p: str, rows: Sequence[tuple[str, str]], now: float) -> None:
    """``command(..., "create", fresh=True)`` of many ``(session_id, body)`` in one transaction.

    Raises:
        Taken: one of the ids is known already (nothing is queued).
    """
    for sid, body in rows:
        command(tx, p, sid, "create", body, now, True)


class Taken(Exception):
    """``command(..., fresh=True)``: the fleet has a row for the session already."""


def command(tx: Tx, p: str, sid: str, kind: str, body: str, now: float, fresh: bool) -> int:
    """Queue a command; ``fresh``: the session row must not exist yet (``create``)."""
    if fresh and known(tx, p, sid):
        raise Taken(sid)
    n = _next_n(tx, p, sid)
    tx.run(
        f"INSERT INTO {p}fleet_commands (session_id, n, kind, body, sent_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (sid, n, kind, body, now),
    )
    if tx.dialect == "postgresql":
        tx.run(f"NOTIFY {p}fleet")
    return n


def command_outcome(tx: Tx, p: str, sid: str, n: int) -> tuple[float | None, str | None]:
    """``(done_at, error)`` of command ``n`` of ``sid``."""
    rows = tx.all(
        f"SELECT done_at, error FROM {p}fleet_commands WHERE session_id = ? AND n = ?", (sid, n)
    )
    return (rows[0][0], rows[0][1]) if rows else (None, None)


def creation(tx: Tx, p: str, sid: str) -> tuple[str, float] | None:
    """``(agent_id, sent_at)`` of the ``create`` command that queued ``sid``, or None."""
    rows = tx.all(
        f"SELECT body, sent_at FROM {p}fleet_commands WHERE session_id = ? AND kind = 'create'"
        " ORDER BY n LIMIT 1",
        (sid,),
    )
    if not rows:
        return None
    agent = json.loads(rows[0][0]).get("agent_id")
    return (agent if isinstance(agent, str) else "", float(rows[0][1]))


def workers(tx: Tx, p: str) -> list[WorkerRow]:
    """Every worker row, oldest first."""
    rows = tx.all(
        f"SELECT worker_id, host, pid, started_at, heartbeat_at, live_agents, max_agents, state"
        f" FROM {p}fleet_workers ORDER BY started_at, worker_id"
    )
    return [
        WorkerRow(
            str(r[0]),
            str(r[1]),
            int(r[2]),
            float(r[3]),
            float(r[4]),
            int(r[5]),
            int(r[6]),
            str(r[7]),
        )
        for r in rows
    ]


def waiting(tx: Tx, p: str) -> tuple[int, int, float | None]:
    """(sessions with undelivered work, undelivered messages, oldest undelivered sent_at)."""
    m = tx.all(
        f"SELECT count(*), count(DISTINCT session_id), min(sent_at) FROM {p}fleet_messages"
        " WHERE delivered_at IS NULL"
    )[0]
    sessions = tx.all(
        f"SELECT count(*) FROM (SELECT session_id FROM {p}fleet_messages WHERE delivered_at IS"
        f" NULL UNION SELECT session_id FROM {p}fleet_commands WHERE done_at IS NULL) AS w"
    )[0][0]
    return int(sessions), int(m[0]), (None if m[2] is None else float(m[2]))


def _chunks(sids: Sequence[str], size: int = 500) -> Iterator[tuple[list[str], str]]:
    """``sids`` in chunks of at most ``size``, each with its ``?, ?, ...`` placeholders."""
    for start in range(0, len(sids), size):
        chunk = list(sids[start : start + size])
        yield chunk, ", ".join("?" * len(chunk))


def assigned_worker(tx: Tx, p: str, sid: str) -> tuple[str, float] | None:
    """The worker ``sid`` is assigned to and its last heartbeat, or None (nobody, or no row)."""
    rows = tx.all(
        f"SELECT w.worker_id, w.heartbeat_at FROM {p}fleet_sessions s"
        f" JOIN {p}fleet_workers w ON w.worker_id = s.worker_id WHERE s.session_id = ?",
        (sid,),
    )
    return (str(rows[0][0]), float(rows[0][1])) if rows else None


def assigned_workers(tx: Tx, p: str, sids: Sequence[str]) -> dict[str, tuple[str, float]]:
    """``assigned_worker`` for many sessions in one read (only those assigned)."""
    out: dict[str, tuple[str, float]] = {}
    for chunk, marks in _chunks(sids):
        rows = tx.all(
            f"SELECT s.session_id, w.worker_id, w.heartbeat_at FROM {p}fleet_sessions s"
            f" JOIN {p}fleet_workers w ON w.worker_id = s.worker_id"
            f" WHERE s.session_id IN ({marks})",
            tuple(chunk),
        )
        out.update((str(r[0]), (str(r[1]), float(r[2]))) for r in rows)
    return out


# --- workers -----------------------------------------------------------------------------------


def register(tx: Tx, p: str, row: WorkerRow) -> None:
    """Insert (or replace) this worker's row."""
    tx.run(f"DELETE FROM {p}fleet_workers WHERE worker_id = ?", (row.worker_id,))
    tx.run(
        f"INSERT INTO {p}fleet_workers (worker_id, host, pid, started_at, heartbeat_at,"
        " live_agents, max_agents, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        attrs.astuple(row),
    )


def heartbeat(tx: Tx, p: str, me: str, now: float, live: int, state: str) -> set[str]:
    """Renew this worker's heartbeat; return the sessions assigned to it."""
    tx.run(
        f"UPDATE {p}fleet_workers SET heartbeat_at = ?, live_agents = ?, state = ?"
        " WHERE worker_id = ?",
        (now, live, state, me),
    )
    rows = tx.all(f"SELECT session_id FROM {p}fleet_sessions WHERE worker_id = ?", (me,))
    return {str(r[0]) for r in rows}


def unregister(tx: Tx, p: str, me: str) -> None:
    """Give every session back and remove this worker's row."""
    tx.run(f"UPDATE {p}fleet_sessions SET worker_id = NULL WHERE worker_id = ?", (me,))
    tx.run(f"DELETE FROM {p}fleet_workers WHERE worker_id = ?", (me,))


def _waiting_work(p: str) -> str:
    """Sessions with undelivered items and no live worker (params: now, now - lease, me).

    Reads the small partial indexes of undelivered messages and undone commands, never the
    whole session table: its cost follows the backlog, not the number of sessions.
    """
    return (
        f"SELECT s.session_id, s.worker_id FROM {p}fleet_sessions s"
        f" LEFT JOIN {p}fleet_workers w ON w.worker_id = s.worker_id"
        " WHERE s.session_id IN ("
        f"SELECT session_id FROM {p}fleet_messages WHERE delivered_at IS NULL"
        f" UNION SELECT session_id FROM {p}fleet_commands WHERE done_at IS NULL)"
        " AND s.not_before <= ?"
        " AND (s.worker_id IS NULL OR w.worker_id IS NULL OR w.heartbeat_at < ?)"
        " AND (s.worker_id IS NULL OR s.worker_id <> ?)"
    )


def _orphaned(p: str) -> str:
    """Sessions assigned to a worker whose heartbeat is older than the lease (same params).

    A takeover: such a session may have an open turn and nothing undelivered. A worker never
    takes over from itself (woken from a pause, it finds its own heartbeat old).
    """
    return (
        f"SELECT s.session_id, s.worker_id FROM {p}fleet_workers w"
        f" JOIN {p}fleet_sessions s ON s.worker_id = w.worker_id"
        " WHERE s.not_before <= ? AND w.heartbeat_at < ? AND w.worker_id <> ?"
    )


def claim(
    tx: Tx, p: str, me: str, now: float, lease: float, limit: int
) -> list[tuple[str, str | None]]:
    """Assign up to ``limit`` sessions with work and no live worker to ``me``.

    Returns ``(session_id, previous worker)`` pairs. On PostgreSQL the rows are locked ``FOR
    UPDATE SKIP LOCKED``, so racing workers claim different sessions.
    """
    lock = " FOR UPDATE OF s SKIP LOCKED" if tx.dialect == "postgresql" else ""
    out: list[tuple[str, str | None]] = []
    for query in (_waiting_work(p), _orphaned(p)):
        if len(out) >= limit:
            break
        rows = tx.all(f"{query} LIMIT ?{lock}", (now, now - lease, me, limit - len(out)))
        for sid, previous in rows:
            changed = tx.run(
                f"UPDATE {p}fleet_sessions SET worker_id = ? WHERE session_id = ?"
                " AND worker_id IS NOT DISTINCT FROM ?",
                (me, sid, previous),
            )
            if changed:
                out.append((str(sid), None if previous is None else str(previous)))
    return out


def has_candidates(tx: Tx, p: str, me: str, now: float, lease: float) -> bool:
    """True when ``claim`` would find something (a read: no write lock taken)."""
    params = (now, now - lease, me)
    return bool(tx.all(f"{_waiting_work(p)} LIMIT 1", params)) or bool(
        tx.all(f"{_orphaned(p)} LIMIT 1", params)
    )


def unclaim(tx: Tx, p: str, me: str, sid: str, previous: str | None, not_before: float) -> None:
    """Give a claim back (its activation failed); nobody tries it again before ``not_before``."""
    tx.run(
        f"UPDATE {p}fleet_sessions SET worker_id = ?, not_before = ?"
        " WHERE session_id = ? AND worker_id = ?",
        (previous, not_before, sid, me),
    )


def release(tx: Tx, p: str, me: str, sids: Iterable[str]) -> None:
    """Give sessions back (unloaded)."""
    for sid in sids:
        tx.run(
            f"UPDATE {p}fleet_sessions SET worker_id = NULL WHERE session_id = ? AND worker_id = ?",
            (sid, me),
        )


def work(tx: Tx, p: str, me: str, limit: int) -> list[Item]:
    """Undelivered messages and undone commands of the sessions assigned to ``me``, in order."""
    rows = tx.all(
        f"SELECT m.session_id, m.n, m.kind, m.body FROM {p}fleet_messages m"
        f" JOIN {p}fleet_sessions s ON s.session_id = m.session_id"
        " WHERE s.worker_id = ? AND m.delivered_at IS NULL"
        " UNION ALL"
        f" SELECT c.session_id, c.n, c.kind, c.body FROM {p}fleet_commands c"
        f" JOIN {p}fleet_sessions s ON s.session_id = c.session_id"
        " WHERE s.worker_id = ? AND c.done_at IS NULL"
        " ORDER BY 1, 2 LIMIT ?",
        (me, me, limit),
    )
    return [Item(str(r[0]), int(r[1]), str(r[2]), json.loads(r[3])) for r in rows]


def work_of(tx: Tx, p: str, sid: str) -> list[Item]:
    """Undelivered messages and undone commands of one session, in order."""
    rows = tx.all(
        f"SELECT session_id, n, kind, body FROM {p}fleet_messages"
        " WHERE session_id = ? AND delivered_at IS NULL"
        " UNION ALL"
        f" SELECT session_id, n, kind, body FROM {p}fleet_commands"
        " WHERE session_id = ? AND done_at IS NULL"
        " ORDER BY 2",
        (sid, sid),
    )
    return [Item(str(r[0]), int(r[1]), str(r[2]), json.loads(r[3])) for r in rows]


def work_of_many(tx: Tx, p: str, sids: Sequence[str]) -> dict[str, list[Item]]:
    """``work_of`` for many sessions in one read (by session, each in order)."""
    out: dict[str, list[Item]] = {}
    for chunk, marks in _chunks(sids):
        rows = tx.all(
            f"SELECT session_id, n, kind, body FROM {p}fleet_messages"
            f" WHERE session_id IN ({marks}) AND delivered_at IS NULL"
            " UNION ALL"
            f" SELECT session_id, n, kind, body FROM {p}fleet_commands"
            f" WHERE session_id IN ({marks}) AND done_at IS NULL"
            " ORDER BY 1, 2",
            (*chunk, *chunk),
        )
        for r in rows:
            out.setdefault(str(r[0]), []).append(
                Item(str(r[0]), int(r[1]), str(r[2]), json.loads(r[3]))
            )
    return out


def settle(
    tx: Tx,
    p: str,
    delivered: Iterable[tuple[str, int]],
    done: Iterable[tuple[str, int, str | None]],
    now: float,
) -> None:
    """Mark messages delivered and commands done (with their error, if any)."""
    for sid, n in delivered:
        tx.run(
            f"UPDATE {p}fleet_messages SET delivered_at = ? WHERE session_id = ? AND n = ?"
            " AND delivered_at IS NULL",
            (now, sid, n),
        )
    for sid, n, error in done:
        tx.run(
            f"UPDATE {p}fleet_commands SET done_at = ?, error = ? WHERE session_id = ? AND n = ?"
            " AND done_at IS NULL",
            (now, error, sid, n),
        )


#: The functions above that only read: SQLite runs them without taking the write lock.
READS: Final = frozenset(
    {
        known,
        command_outcome,
        creation,
        workers,
        waiting,
        assigned_worker,
        assigned_workers,
        has_candidates,
        work,
        work_of,
        work_of_many,
    }
)
