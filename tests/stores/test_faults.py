"""Storage faults at every database call of a turn, on SQLite and PostgreSQL
(docs/reliability.md#storage-fault-matrix).

The store under test connects through a connection class that counts the calls it makes
(statements and commits) once armed, and makes the n-th one fail. For every n over a whole
turn — text, a parallel pair of tool calls, a single tool call, the turn's end, and the
shutdown that releases ownership — and for each fault kind:

- ``reset-before``: the connection is lost before the statement runs (nothing of the
  transaction is stored);
- ``reset-after``: the statement runs, then the connection is lost before the reply — after a
  ``COMMIT`` this is the ambiguous commit, settled by reading back;
- ``busy``: the database is busy/locked (SQLITE_BUSY, PostgreSQL ``lock_not_available``);
- ``disk-full``: ``database or disk is full`` (SQLITE_FULL, PostgreSQL ``disk_full``);

the turn runs on a runtime using that store, and then, with clean store objects:

1. nothing is lost or duplicated: the stored seqs are dense, every event the agent saw
   acknowledged (``session/event``, published after commit) is stored exactly as published,
   and the stored log is a prefix of the agent's in-memory log;
2. the outcome is coded: the first three kinds are retried or settled and the turn completes;
   disk full during the turn stops the agent with ``agent/error`` ``STORE_FAILED`` and disposes
   it (during the shutdown's release, which is repeatable, it is retried);
3. the session resumes (crash repair closes an interrupted turn) and a next turn completes with
   a well-formed log.

A store that trusts an unknown commit outcome instead of reading it back must be caught.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    Event,
    Reply,
    ScriptedModel,
    SessionNotFoundError,
    invariants,
    open_runtime,
    tool,
)
from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop.stores import SqliteStore
from dsh_agent_loop.stores.sqlite import _sync as _sqlite_sync

from .conftest import drop_pg_tables, new_pg_prefix, postgres_dsn

KINDS = ("reset-before", "reset-after", "busy", "disk-full")
OPTIONS = AgentOptions(id="faulty", provider="s", model="m")


# --- fault injection ------------------------------------------------------------------------------


@attrs.define
class Faults:
    """Counts database calls while armed; the ``fail_at``-th fails with ``kind``."""

    kind: str = ""
    fail_at: int | None = None
    calls: int = 0
    armed: bool = False
    phase: str = ""
    fired: tuple[str, str] | None = None
    """(phase, statement) of the call that failed."""
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    def arm(self, kind: str, fail_at: int | None) -> None:
        self.kind, self.fail_at, self.calls, self.armed = kind, fail_at, 0, True

    def due(self, statement: str) -> str | None:
        """The fault kind if this call must fail, else None (called in worker threads)."""
        with self._lock:
            if not self.armed:
                return None
            self.calls += 1
            if self.calls != self.fail_at:
                return None
            self.fired = (self.phase, " ".join(statement.split())[:60])
            return self.kind


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


def faulty_sqlite(faults: Faults) -> type[sqlite3.Connection]:
    """A ``sqlite3.Connection`` whose statements fail as ``faults`` says."""

    class FaultySqlite(sqlite3.Connection):
        @contextmanager
        def _fault(self, statement: str) -> Iterator[None]:
            kind = faults.due(statement)
            if kind == "reset-before":
                self.close()  # an open transaction is rolled back
                raise sqlite_error("injected: connection lost", 10)
            if kind == "busy":
                raise sqlite_error("database is locked", 5)
            if kind == "disk-full":
                raise sqlite_error("database or disk is full", 13)
            yield
            if kind == "reset-after":
                self.close()
                raise sqlite_error("injected: connection lost after the statement", 10)

        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            with self._fault(sql):
                return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
            with self._fault(sql):
                return super().executemany(sql, parameters)

    return FaultySqlite


def pg_fault(faults: Faults, conn: psycopg.Connection[Any], statement: str) -> Iterator[None]:
    kind = faults.due(statement)
    if kind == "reset-before":
        conn.close()  # the server rolls back the open transaction
        raise psycopg.OperationalError("injected: server closed the connection unexpectedly")
    if kind == "busy":
        raise psycopg.errors.LockNotAvailable("injected: could not obtain lock")
    if kind == "disk-full":
        raise psycopg.errors.DiskFull("injected: could not extend file: No space left on device")
    yield
    if kind == "reset-after":
        conn.close()
        raise psycopg.OperationalError("injected: connection lost before the reply")


def faulty_postgres(faults: Faults) -> type[psycopg.Connection[Any]]:
    """A ``psycopg.Connection`` whose statements and commits fail as ``faults`` says."""
    fault = contextmanager(pg_fault)

    class FaultyCursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            with fault(faults, self.connection, str(query)):
                return super().execute(query, params, **kw)

        def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
            with fault(faults, self.connection, str(query)):
                super().executemany(query, params_seq, **kw)

    class FaultyPostgres(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            return super().connect(*args, cursor_factory=FaultyCursor, **kwargs)

        def commit(self) -> None:
            with fault(faults, self, "COMMIT"):
                super().commit()

    return FaultyPostgres


# --- the harness ----------------------------------------------------------------------------------


@attrs.define
class Backend:
    name: str
    make: Callable[[Faults | None], SessionStore]
    """A store on the shared location; with ``Faults``, one that injects them."""


@attrs.define
class Case:
    """What one run observed."""

    faults: Faults
    acked: dict[int, Event]
    errors: list[str]
    disposed: bool
    in_memory: list[Event]


@tool
async def work(n: int) -> str:
    """Do a unit of work."""
    await trio.lowlevel.checkpoint()
    return f"work {n} done"


def turn_script() -> ScriptedModel:
    return ScriptedModel(
        [
            Reply.tool_calls(("work", {"n": 1}), ("work", {"n": 2}), text="two at once"),
            Reply.tool_calls(("work", {"n": 3}), text="one more"),
            Reply.text("all done, thank you"),
        ]
    )


async def run_turn(backend: Backend, sid: str, kind: str, fail_at: int | None) -> Case:
    faults = Faults()
    acked: dict[int, Event] = {}
    errors: list[str] = []
    disposed = trio.Event()
    async with open_runtime(
        store=backend.make(faults), providers={"s": turn_script()}, tools=[work]
    ) as rt:
        rt.hooks.on(
            "session/event", lambda n: acked.__setitem__(n.data["event"].seq, n.data["event"])
        )
        rt.hooks.on("agent/error", lambda n: errors.append(n.data["error"]["code"]))
        rt.hooks.on("agent/disposed", lambda n: disposed.set())
        handle = await rt.agents.create(sid, options=OPTIONS)
        agent = handle.agent
        await agent.flush()  # the seed is stored before the faults start
        faults.phase = "turn"
        faults.arm(kind, fail_at)
        agent.followup("please do the work")
        with trio.fail_after(20):
            await agent.wait_idle()
            if errors:
                await disposed.wait()
        faults.phase = "shutdown"
        in_memory = list(agent.session.events)
    faults.armed = False
    return Case(faults, acked, errors, disposed.is_set(), in_memory)


async def stored_log(store: SessionStore, sid: str) -> list[Event]:
    try:
        handle = await store.open(sid, "read")
    except SessionNotFoundError:
        return []
    try:
        return list(await handle.read())
    finally:
        await handle.close()


async def check_case(backend: Backend, sid: str, kind: str, case: Case) -> list[str]:
    """Everything the module docstring promises, as a list of problems."""
    problems: list[str] = []
    store = backend.make(None)
    try:
        stored = await stored_log(store, sid)
        if [e.seq for e in stored] != list(range(len(stored))):
            problems.append("stored seqs are not dense from 0")
        for seq, event in sorted(case.acked.items()):
            if seq >= len(stored) or stored[seq] != event:
                problems.append(f"acknowledged seq {seq} ({event.type}) is not stored as published")
        if stored != case.in_memory[: len(stored)]:
            problems.append("the stored log is not a prefix of the agent's log")
        in_turn = case.faults.fired is not None and case.faults.fired[0] == "turn"
        if kind == "disk-full" and in_turn:
            # (a failure seen by the turn and again by its closing flush is reported twice)
            if set(case.errors) != {"STORE_FAILED"} or not case.disposed:
                problems.append(f"expected STORE_FAILED and disposal, got {case.errors}")
        else:
            ends = [e.data["reason"]["kind"] for e in stored if e.type == "turn/end"]
            if case.errors or ends != ["completed"] or stored != case.in_memory:
                problems.append(f"expected the turn to complete, got {case.errors} {ends}")
        problems += await resume_and_continue(store, sid)
    finally:
        await store.aclose()
    return problems


async def resume_and_continue(store: SessionStore, sid: str) -> list[str]:
    model = ScriptedModel([Reply.text("resumed and well")])
    async with open_runtime(store=store, providers={"s": model}, tools=[work]) as rt:
        handle = await rt.agents.resume(sid, options=OPTIONS)
        handle.agent.followup("still there?")
        with trio.fail_after(20):
            await handle.agent.wait_idle()
        events = list(handle.agent.session.events)
    problems = [f"after resume: {v}" for v in invariants.check(events, allow_open_turn=False)]
    if events[-1].type != "turn/end" or events[-1].data["reason"]["kind"] != "completed":
        problems.append("the turn after resume did not complete")
    return problems


@attrs.define
class Matrix:
    """Results per fault kind, printed as a table."""

    rows: dict[str, Counter[str]] = attrs.Factory(dict)
    problems: list[str] = attrs.Factory(list)

    def add(self, kind: str, case: Case, problems: list[str], n: int) -> None:
        row = self.rows.setdefault(kind, Counter())
        row["runs"] += 1
        row["STORE_FAILED" if "STORE_FAILED" in case.errors else "continued"] += 1
        row["problems"] += bool(problems)
        self.problems += [f"{kind} at call {n} ({case.faults.fired}): {p}" for p in problems]

    def table(self, backend: str, calls: int) -> str:
        lines = [f"faults[{backend}]: {calls} database calls per turn"]
        for kind, row in self.rows.items():
            lines.append(
                f"  {kind:<13} runs={row['runs']:<3} continued={row['continued']:<3} "
                f"STORE_FAILED={row['STORE_FAILED']:<3} problems={row['problems']}"
            )
        return "\n".join(lines)


async def fault_matrix(backend: Backend, kinds: tuple[str, ...] = KINDS) -> tuple[Matrix, int]:
    dry = await run_turn(backend, "dry-run", "", None)
    assert not dry.errors
    calls = dry.faults.calls
    assert calls >= 12, calls  # three commits of at least four calls, and the release
    matrix = Matrix()
    for kind in kinds:
        for n in range(1, calls + 1):
            sid = f"{kind}-{n}"
            case = await run_turn(backend, sid, kind, n)
            problems = [] if case.faults.fired else [f"call {n} never happened"]
            problems += await check_case(backend, sid, kind, case)
            matrix.add(kind, case, problems, n)
    return matrix, calls


# --- the tests ------------------------------------------------------------------------------------


def sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "faults.db"

    def make(faults: Faults | None) -> SessionStore:
        if faults is None:
            return SqliteStore(path)
        return SqliteStore(path, connection_factory=faulty_sqlite(faults))

    return Backend("sqlite", make)


@pytest.fixture
def postgres_backend() -> Iterator[Backend]:
    from dsh_agent_loop.stores.postgres import PostgresStore

    dsn, prefix = postgres_dsn(), new_pg_prefix()

    def make(faults: Faults | None) -> SessionStore:
        if faults is None:
            return PostgresStore(dsn, table_prefix=prefix)
        return PostgresStore(dsn, table_prefix=prefix, connection_class=faulty_postgres(faults))

    try:
        yield Backend("postgres", make)
    finally:
        drop_pg_tables(dsn, prefix)


def report(matrix: Matrix, name: str, calls: int, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n" + matrix.table(name, calls))
        for problem in matrix.problems[:20]:
            print("    " + problem)


async def test_sqlite_fault_at_every_call_of_a_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix, calls = await fault_matrix(sqlite_backend(tmp_path))
    report(matrix, "sqlite", calls, capsys)
    assert matrix.problems == []
    assert matrix.rows["disk-full"]["STORE_FAILED"] > 0
    assert all(matrix.rows[k]["continued"] == calls for k in KINDS[:3])


async def test_postgres_fault_at_every_call_of_a_turn(
    postgres_backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix, calls = await fault_matrix(postgres_backend)
    report(matrix, "postgres", calls, capsys)
    assert matrix.problems == []
    assert matrix.rows["disk-full"]["STORE_FAILED"] > 0
    assert all(matrix.rows[k]["continued"] == calls for k in KINDS[:3])


async def test_the_harness_catches_a_store_that_trusts_an_unknown_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The broken variant: an outcome it could not see is taken as committed, unread.
    monkeypatch.setattr(_sqlite_sync, "rows_stored", lambda conn, work: True)
    matrix, calls = await fault_matrix(sqlite_backend(tmp_path), kinds=("reset-before",))
    report(matrix, "sqlite, broken store", calls, capsys)
    assert any("is not stored" in p for p in matrix.problems)


# --- ownership taken away mid-turn ----------------------------------------------------------------


def steal_sqlite(path: Path, sid: str, dead_pid: int) -> None:
    """Another (dead) process's owner row replaces ours, as after a takeover."""
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute(  # a slot nobody holds: its process is gone
            "UPDATE owners SET token='thief', pid=?, lock_slot=1 WHERE session_id=?",
            (dead_pid, sid),
        )
    conn.close()


def steal_postgres(dsn: str, prefix: str, sid: str) -> None:
    """A newer epoch holds the lease (expired already, so the session can be resumed)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {prefix}leases SET owner_token='thief', epoch=epoch+1,"
            " expires_at='-infinity' WHERE session_id=%s",
            (sid,),
        )


async def ownership_lost_mid_turn(store: SessionStore, steal: Callable[[str], None]) -> Case:
    sid = "stolen"
    acked: dict[int, Event] = {}
    errors: list[str] = []
    disposed = trio.Event()

    @tool
    async def work(n: int) -> str:
        """Do a unit of work, during which another owner takes the session."""
        await trio.to_thread.run_sync(steal, sid)
        return f"work {n} done"

    async with open_runtime(store=store, providers={"s": turn_script()}, tools=[work]) as rt:
        rt.hooks.on(
            "session/event", lambda n: acked.__setitem__(n.data["event"].seq, n.data["event"])
        )
        rt.hooks.on("agent/error", lambda n: errors.append(n.data["error"]["code"]))
        rt.hooks.on("agent/disposed", lambda n: disposed.set())
        handle = await rt.agents.create(sid, options=OPTIONS)
        handle.agent.followup("please do the work")
        with trio.fail_after(20):
            await handle.agent.wait_idle()
            if errors:
                await disposed.wait()
        in_memory = list(handle.agent.session.events)
    return Case(Faults(), acked, errors, disposed.is_set(), in_memory)


async def check_lost(backend: Backend, case: Case) -> None:
    assert set(case.errors) == {"OWNERSHIP_LOST"}
    assert case.disposed
    store = backend.make(None)
    try:
        stored = await stored_log(store, "stolen")
        assert [e.seq for e in stored] == list(range(len(stored)))
        assert stored == case.in_memory[: len(stored)]
        assert len(stored) < len(case.in_memory)
        assert all(stored[seq] == event for seq, event in case.acked.items())
        assert await resume_and_continue(store, "stolen") == []
    finally:
        await store.aclose()


async def test_sqlite_ownership_taken_mid_turn_stops_the_agent(tmp_path: Path) -> None:
    proc = await trio.lowlevel.open_process(["true"])
    await proc.wait()  # reaped: its pid names no process
    backend = sqlite_backend(tmp_path)
    path = tmp_path / "faults.db"
    case = await ownership_lost_mid_turn(
        backend.make(None), lambda sid: steal_sqlite(path, sid, proc.pid)
    )
    await check_lost(backend, case)


async def test_postgres_ownership_taken_mid_turn_stops_the_agent() -> None:
    from dsh_agent_loop.stores.postgres import PostgresStore

    dsn, prefix = postgres_dsn(), new_pg_prefix()
    backend = Backend("postgres", lambda _: PostgresStore(dsn, table_prefix=prefix))
    try:
        case = await ownership_lost_mid_turn(
            backend.make(None), lambda sid: steal_postgres(dsn, prefix, sid)
        )
        await check_lost(backend, case)
    finally:
        drop_pg_tables(dsn, prefix)
