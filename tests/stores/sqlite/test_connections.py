"""``stores/sqlite/_connections.py``: the writer and reader connections and the hop to each.

Real SQLite files in ``tmp_path``; faults come from a ``sqlite3.Connection`` subclass that
fails chosen statements, as a full disk, a busy file or a lost connection would.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop._errors import SessionOwnershipLostError, StoreError
from dsh_agent_loop.stores import SqliteStore
from dsh_agent_loop.stores.sqlite import _connections
from dsh_agent_loop.stores.sqlite import _sync as sql
from dsh_agent_loop.stores.sqlite._connections import RETRY_DELAYS, Attempt, Connections

from ..conftest import ev, header

ME = sql.Owner("test-host", 1, None)


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code
    return exc


BUSY, IOERR, CORRUPT = 5, 10, 11


class Plan:
    """Faults for statements starting with a prefix: ``before`` (not run) or ``after`` (run)."""

    def __init__(self) -> None:
        self.faults: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()

    def add(self, prefix: str, when: str = "before", code: int = IOERR, times: int = 1) -> None:
        self.faults += [(prefix, when, code)] * times

    def due(self, statement: str, when: str) -> int | None:
        with self.lock:
            for i, (prefix, at, code) in enumerate(self.faults):
                if at == when and statement.lstrip().upper().startswith(prefix):
                    del self.faults[i]
                    return code
        return None


def faulty(plan: Plan) -> type[sqlite3.Connection]:
    class Faulty(sqlite3.Connection):
        def execute(self, statement: str, parameters: Any = (), /) -> sqlite3.Cursor:
            if (code := plan.due(statement, "before")) is not None:
                raise sqlite_error(f"injected before {statement[:20]}", code)
            cursor = super().execute(statement, parameters)
            if (code := plan.due(statement, "after")) is not None:
                raise sqlite_error(f"injected after {statement[:20]}", code)
            return cursor

        def executemany(self, statement: str, parameters: Any, /) -> sqlite3.Cursor:
            if (code := plan.due(statement, "before")) is not None:
                raise sqlite_error(f"injected before {statement[:20]}", code)
            return super().executemany(statement, parameters)

    return Faulty


def make(
    path: Path, *, synchronous: str = "NORMAL", factory: type[sqlite3.Connection] | None = None
) -> Connections:
    return Connections(
        str(path),
        synchronous=synchronous,
        busy_timeout=0.0,
        factory=factory or sqlite3.Connection,
    )


@pytest.fixture
async def conns(tmp_path: Path) -> AsyncIterator[Connections]:
    connections = make(tmp_path / "s.db")
    try:
        yield connections
    finally:
        await connections.close()


def pragma(name: str) -> Callable[[sqlite3.Connection], Any]:
    return lambda conn: conn.execute(f"PRAGMA {name}").fetchone()[0]


def stored_seqs(path: Path, sid: str = "s1") -> list[int]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT seq FROM events WHERE session_id=? ORDER BY seq", (sid,))
        return [int(seq) for (seq,) in rows]


async def own(conns: Connections, sid: str = "s1", token: str = "tok") -> None:
    """Create the session ``sid`` owned by ``token``."""

    def acquire(conn: sqlite3.Connection) -> tuple[int, str]:
        return sql.acquire(conn, sid, ME, token, {"session_id": sid})

    await conns.on_writer(acquire)


def work(sid: str = "s1", first: int = 0, count: int = 2, token: str = "tok") -> sql.Work:
    rows = [(sid, seq, "user/message", f'{{"seq":{seq}}}') for seq in range(first, first + count)]
    return sql.Work(sid, token, first, rows)


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(("synchronous", "level"), [("NORMAL", 1), ("FULL", 2)])
async def test_connections_are_wal_with_the_durability_level(
    tmp_path: Path, synchronous: str, level: int
) -> None:
    conns = Connections(
        str(tmp_path / "deep" / "er" / "s.db"),
        synchronous=synchronous,
        busy_timeout=2.5,
        factory=sqlite3.Connection,
    )
    try:
        for on in (conns.on_writer, conns.on_reader):
            assert await on(pragma("journal_mode")) == "wal"
            assert await on(pragma("synchronous")) == level
            assert await on(pragma("busy_timeout")) == 2500
        tables = await conns.on_reader(
            lambda c: {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        )
        assert tables == {"sessions", "events", "owners"}
        # only the writer's own autocheckpoint is raised (a backstop for the background one)
        assert await conns.on_writer(pragma("wal_autocheckpoint")) == 10_000
        assert await conns.on_reader(pragma("wal_autocheckpoint")) == 1000
    finally:
        await conns.close()
    assert (tmp_path / "deep" / "er" / "s.db").is_file()  # parent directories were made


async def test_connect_runs_in_the_calling_thread_and_sets_no_autocommit_transactions(
    tmp_path: Path,
) -> None:
    conns = make(tmp_path / "s.db")
    conn = conns.connect()
    try:
        assert conn.isolation_level is None  # explicit BEGIN IMMEDIATE only
        conn.execute("SELECT 1")
        assert not conn.in_transaction
    finally:
        conn.close()


async def test_a_failing_configuration_closes_the_new_connection(tmp_path: Path) -> None:
    opened: list[sqlite3.Connection] = []

    class Fails(sqlite3.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

        def executescript(self, script: str, /) -> sqlite3.Cursor:
            raise sqlite_error("injected schema failure", IOERR)

    conns = make(tmp_path / "s.db", factory=Fails)
    with pytest.raises(sqlite3.OperationalError, match="schema"):
        conns.connect()
    (conn,) = opened
    with pytest.raises(sqlite3.ProgrammingError):  # closed
        conn.execute("SELECT 1")


# --- the writer ---------------------------------------------------------------------------------


async def test_the_writer_is_opened_lazily_and_kept(conns: Connections) -> None:
    assert conns.writer is None
    first = await conns.on_writer(lambda conn: conn)
    assert conns.writer is first
    assert await conns.on_writer(lambda conn: conn) is first
    await conns.close()
    assert conns.writer is None
    assert await conns.on_writer(lambda conn: conn) is not first  # reopened on next use


async def test_writer_calls_run_in_a_worker_thread(conns: Connections) -> None:
    here = threading.get_ident()
    assert await conns.on_writer(lambda _: threading.get_ident()) != here
    assert await conns.on_reader(lambda _: threading.get_ident()) != here
    assert await conns.hop(threading.get_ident) != here


async def test_a_database_error_is_retried_then_reported(
    conns: Connections, autojump_clock: trio.testing.MockClock
) -> None:
    calls: list[float] = []

    def busy(conn: sqlite3.Connection) -> int:
        calls.append(autojump_clock.current_time())  # (a worker thread: the clock itself)
        if len(calls) <= 2:
            raise sqlite_error("database is locked", BUSY)
        return 7

    start = trio.current_time()
    assert await conns.on_writer(busy) == 7
    assert conns.retries == 2
    waits = [t - start for t in calls]
    assert waits == pytest.approx([0.0, RETRY_DELAYS[0], RETRY_DELAYS[0] + RETRY_DELAYS[1]])

    def always(conn: sqlite3.Connection) -> None:
        raise sqlite_error("disk I/O error", IOERR)

    with pytest.raises(StoreError) as info:
        await conns.on_writer(always)
    assert conns.retries == 2 + len(RETRY_DELAYS)
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert conns.path in str(info.value)
    assert "disk I/O error" in str(info.value)


async def test_corruption_and_other_errors_are_not_retried(conns: Connections) -> None:
    calls = 0

    def corrupt(conn: sqlite3.Connection) -> None:
        nonlocal calls
        calls += 1
        raise sqlite_error("database disk image is malformed", CORRUPT)

    with pytest.raises(StoreError) as info:
        await conns.on_writer(corrupt)
    assert (calls, conns.retries, info.value.code) == (1, 0, "STORE_CORRUPT")

    def bug(conn: sqlite3.Connection) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bug")

    with pytest.raises(StoreError, match="ValueError: a bug") as info:
        await conns.on_writer(bug)
    assert calls == 2
    assert info.value.code == "STORE_FAILED"

    lost = SessionOwnershipLostError("gone")

    def refuses(conn: sqlite3.Connection) -> None:
        raise lost

    with pytest.raises(SessionOwnershipLostError) as passed:
        await conns.on_writer(refuses)
    assert passed.value is lost  # a store error leaves as it is


async def test_a_failure_inside_a_transaction_rolls_it_back_and_frees_the_file(
    tmp_path: Path, conns: Connections
) -> None:
    await own(conns)

    def half_done(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM owners")
        raise RuntimeError("after a write")

    with pytest.raises(StoreError, match="RuntimeError"):
        await conns.on_writer(half_done)
    writer = conns.writer
    assert writer is not None
    assert not writer.in_transaction
    with sqlite3.connect(tmp_path / "s.db", timeout=0) as other:  # the write lock is free
        other.execute("BEGIN IMMEDIATE")
        assert other.execute("SELECT count(*) FROM owners").fetchone() == (1,)
        other.execute("ROLLBACK")


async def test_a_broken_writer_is_replaced(conns: Connections) -> None:
    seen: list[sqlite3.Connection] = []

    def breaks_once(conn: sqlite3.Connection) -> str:
        seen.append(conn)
        if len(seen) == 1:
            conn.execute("BEGIN IMMEDIATE")
            conn.close()  # nothing can roll it back on this connection
            raise sqlite_error("injected: connection lost", IOERR)
        return "ok"

    assert await conns.on_writer(breaks_once) == "ok"
    assert conns.retries == 1
    assert seen[0] is not seen[1]
    assert conns.writer is seen[1]


# --- the reader ---------------------------------------------------------------------------------


async def test_the_reader_is_its_own_connection_and_sees_commits(
    tmp_path: Path, conns: Connections
) -> None:
    await own(conns)
    reader = await conns.on_reader(lambda conn: conn)
    assert reader is not conns.writer
    assert await conns.on_reader(lambda conn: conn) is reader
    infos = await conns.on_reader(lambda conn: sql.infos(conn, None))
    assert infos == []  # no stored event yet
    attempt = await conns.commit_attempt([work()])
    assert attempt.results == [None]
    (info,) = await conns.on_reader(lambda conn: sql.infos(conn, None))
    assert (info.session_id, info.event_count) == ("s1", 2)


async def test_a_reader_failure_is_a_store_error_and_ends_its_transaction(
    conns: Connections,
) -> None:
    def fails_in_transaction(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN")
        conn.execute("SELECT * FROM events").fetchall()
        raise KeyError("bug")

    with pytest.raises(StoreError, match="KeyError") as info:
        await conns.on_reader(fails_in_transaction)
    assert isinstance(info.value.__cause__, KeyError)
    assert await conns.on_reader(lambda conn: conn.in_transaction) is False

    def broken(conn: sqlite3.Connection) -> None:
        conn.close()
        raise sqlite_error("injected: connection lost", IOERR)

    first = await conns.on_reader(lambda conn: conn)
    with pytest.raises(StoreError, match="connection lost"):
        await conns.on_reader(broken)
    assert await conns.on_reader(lambda conn: conn) is not first  # replaced


# --- commit attempts ------------------------------------------------------------------------------


async def test_a_commit_attempt_stores_and_reports_each_session(
    tmp_path: Path, conns: Connections
) -> None:
    await own(conns, "s1")
    await own(conns, "s2")
    attempt = await conns.commit_attempt([work("s1"), work("s2", token="stale")])
    assert attempt.failure is None
    assert attempt.results is not None
    ok, refused = attempt.results
    assert ok is None
    assert isinstance(refused, SessionOwnershipLostError)
    assert stored_seqs(tmp_path / "s.db", "s1") == [0, 1]
    assert stored_seqs(tmp_path / "s.db", "s2") == []


async def test_a_commit_that_fails_before_commit_is_rolled_back(tmp_path: Path) -> None:
    plan = Plan()
    conns = make(tmp_path / "s.db", factory=faulty(plan))
    try:
        await own(conns)
        plan.add("COMMIT", "before", BUSY)
        attempt = await conns.commit_attempt([work()])
        assert attempt == Attempt(failure=attempt.failure, stored=[False])
        assert sql.is_busy(attempt.failure)  # type: ignore[arg-type]
        assert stored_seqs(tmp_path / "s.db") == []
        writer = conns.writer
        assert writer is not None
        assert not writer.in_transaction
    finally:
        await conns.close()


async def test_a_commit_that_failed_after_storing_is_read_back(tmp_path: Path) -> None:
    plan = Plan()
    conns = make(tmp_path / "s.db", factory=faulty(plan))
    try:
        await own(conns)
        plan.add("COMMIT", "after", IOERR)  # committed, but the caller saw an error
        attempt = await conns.commit_attempt([work(), work("s9", token="x")])
        assert attempt.results is None
        assert attempt.stored == [True, False]  # read back: never a blind retry
        assert not attempt.broken
        assert stored_seqs(tmp_path / "s.db") == [0, 1]
    finally:
        await conns.close()


async def test_an_unreadable_outcome_is_reported_as_unknown(tmp_path: Path) -> None:
    plan = Plan()
    conns = make(tmp_path / "s.db", factory=faulty(plan))
    try:
        await own(conns)
        plan.add("COMMIT", "after", IOERR)
        plan.add("SELECT SEQ, JSON", "before", IOERR)  # the read-back fails too
        attempt = await conns.commit_attempt([work()])
        assert attempt.results is None
        assert attempt.stored is None
        assert isinstance(attempt.unknown, sqlite3.OperationalError)
        assert isinstance(attempt.failure, sqlite3.OperationalError)
    finally:
        await conns.close()


async def test_a_non_database_error_in_a_commit_stores_nothing(
    tmp_path: Path, conns: Connections
) -> None:
    await own(conns)

    def rows() -> Any:
        yield ("s1", 0, "user/message", "{}")
        raise ValueError("cannot encode")

    bad = sql.Work("s1", "tok", 0, rows())
    attempt = await conns.commit_attempt([bad])
    assert isinstance(attempt.failure, ValueError)
    assert attempt.stored == [False]
    assert not attempt.broken
    assert stored_seqs(tmp_path / "s.db") == []
    assert await conns.on_writer(lambda conn: conn.in_transaction) is False


async def test_a_writer_that_cannot_connect_is_a_broken_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conns = make(tmp_path / "s.db")

    def refuse(self: Connections) -> sqlite3.Connection:
        raise sqlite_error("unable to open database file", 14)

    monkeypatch.setattr(_connections.Connections, "connect", refuse)
    attempt = await conns.commit_attempt([work()])
    assert attempt.broken
    assert attempt.stored == [False]
    assert conns.writer is None


# --- errors and closing ---------------------------------------------------------------------------


def test_error_names_the_file_and_session_and_chains_the_cause(tmp_path: Path) -> None:
    conns = make(tmp_path / "s.db")
    cause = sqlite_error("database disk image is malformed", CORRUPT)
    error = conns.error(cause, "s1")
    assert str(error) == (
        f"sqlite store {conns.path!r}, session 's1': database disk image is malformed"
    )
    assert error.code == "STORE_CORRUPT"
    assert error.__cause__ is cause
    other = conns.error(OSError("no space"))
    assert str(other) == f"sqlite store {conns.path!r}: OSError: no space"
    assert other.code == "STORE_FAILED"


async def test_hop_maps_failures_to_store_errors(conns: Connections) -> None:
    def fails() -> None:
        raise PermissionError("denied")

    with pytest.raises(StoreError, match="PermissionError: denied"):
        await conns.hop(fails)
    assert await conns.hop(lambda: 5) == 5


async def test_close_closes_both_connections(conns: Connections) -> None:
    writer = await conns.on_writer(lambda conn: conn)
    reader = await conns.on_reader(lambda conn: conn)
    await conns.close()
    for conn in (writer, reader):
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")
    await conns.close()  # nothing open: a no-op


# --- file modes ------------------------------------------------------------------------------


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def file_modes(path: Path) -> dict[str, int]:
    """The permission bits of the database file and each side file that exists now."""
    modes = {}
    for suffix in ("", "-wal", "-shm", "-owners"):
        with contextlib.suppress(FileNotFoundError):
            modes[suffix] = stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode)
    return modes


async def test_a_new_database_and_its_side_files_are_0600(
    tmp_path: Path, permissive_umask: None
) -> None:
    path = tmp_path / "new" / "sessions.db"
    async with SqliteStore(path) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.flush()
        assert file_modes(path) == dict.fromkeys(("", "-wal", "-shm", "-owners"), 0o600)
        await handle.close()
    assert file_modes(path) == {"": 0o600, "-owners": 0o600}  # (SQLite removed -wal, -shm)
    assert sorted(os.listdir(path.parent)) == ["sessions.db", "sessions.db-owners"]


async def test_an_existing_database_keeps_its_mode_and_side_files_follow_it(
    tmp_path: Path, permissive_umask: None
) -> None:
    path = tmp_path / "shared.db"
    sqlite3.connect(path).close()  # made by someone else (0644 under this umask)...
    os.chmod(path, 0o640)  # ...and opened to their group on purpose
    async with SqliteStore(path) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.flush()
        assert file_modes(path) == dict.fromkeys(("", "-wal", "-shm", "-owners"), 0o640)
        await handle.close()


def test_creating_the_database_never_replaces_one_made_meanwhile(tmp_path: Path) -> None:
    """``create_private`` links its new file into place: an existing one wins, untouched."""
    path = tmp_path / "s.db"
    _connections.create_private(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    path.write_bytes(b"theirs")  # (a test file, no SQLite connection on it)
    os.chmod(path, 0o644)
    _connections.create_private(str(path))
    assert path.read_bytes() == b"theirs"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.listdir(tmp_path) == ["s.db"]  # no temporary file left behind
