"""``stores/sqlite/_claims.py``: concurrent creates share a transaction, each with its own outcome,
and a cancelled create never leaves a session owned with no handle (real SQLite files)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dsh_agent_loop._errors import (
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    StoreError,
)
from dsh_agent_loop._session.store import WriteHandle
from dsh_agent_loop.stores import SqliteStore
from dsh_agent_loop.stores.sqlite import _claims
from dsh_agent_loop.stores.sqlite import _sync as sql

from ..conftest import ev, header


class Gated(sqlite3.Connection):
    """Holds ``BEGIN IMMEDIATE`` on the current ``gate`` (when set) until it is opened."""

    gate: threading.Event | None = None
    entered = threading.Event()
    fail_owner_of: str | None = None

    def execute(self, sql_text: str, *args: Any) -> sqlite3.Cursor:
        gate = Gated.gate
        if gate is not None and sql_text == "BEGIN IMMEDIATE":
            Gated.entered.set()
            gate.wait(10)
        if (
            Gated.fail_owner_of is not None
            and sql_text.startswith("INSERT OR REPLACE INTO owners")
            and args[0][0] == Gated.fail_owner_of
        ):
            raise ValueError("injected fault")
        return super().execute(sql_text, *args)


@pytest.fixture
def gated() -> Iterator[type[Gated]]:
    yield Gated
    Gated.gate, Gated.fail_owner_of = None, None
    Gated.entered.clear()


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The session ids of every claim transaction, in order."""
    seen: list[list[str]] = []
    real = sql.acquire_many

    def recording(conn: sqlite3.Connection, me: sql.Owner, claims: Any) -> Any:
        seen.append([c[0] for c in claims])
        return real(conn, me, claims)

    monkeypatch.setattr(sql, "acquire_many", recording)
    return seen


async def hold(gated: type[Gated]) -> threading.Event:
    """Hold the next transactions at ``BEGIN IMMEDIATE``; return once one is held."""
    gate = threading.Event()
    gated.entered.clear()
    gated.gate = gate
    return gate


async def held(gated: type[Gated]) -> None:
    await trio.to_thread.run_sync(gated.entered.wait, 10)


def rows(path: Path, table: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        return sorted(r[0] for r in conn.execute(f"SELECT session_id FROM {table}"))


async def use(handle: WriteHandle) -> None:
    await handle.append([ev(0)])
    await handle.close()


async def test_creates_made_concurrently_share_one_transaction(
    tmp_path: Path, batches: list[list[str]], gated: type[Gated]
) -> None:
    async with SqliteStore(tmp_path / "s.db", connection_factory=Gated) as store:
        handles: dict[str, WriteHandle] = {}

        async def create(sid: str) -> None:
            handles[sid] = await store.create(header(sid))

        gate = await hold(gated)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "first")
            await held(gated)  # its transaction runs: the next ones queue
            for i in range(10):
                nursery.start_soon(create, f"s{i}")
            await trio.testing.wait_all_tasks_blocked()
            gated.gate = None
            gate.set()
        assert [sorted(b) for b in batches] == [["first"], sorted(f"s{i}" for i in range(10))]
        for handle in handles.values():
            await use(handle)
        for sid in handles:
            assert list(await (await store.open(sid, "read")).read()) == [ev(0)]
        assert rows(tmp_path / "s.db", "owners") == []


async def test_a_refused_or_failing_claim_fails_alone(
    tmp_path: Path, batches: list[list[str]], gated: type[Gated]
) -> None:
    async with SqliteStore(tmp_path / "s.db", connection_factory=Gated) as store:
        await use(await store.create(header("exists")))
        owner = await store.create(header("owned"))
        gated.fail_owner_of = "faulty"  # fails after its sessions row went in
        outcomes: dict[str, object] = {}

        async def create(sid: str) -> None:
            try:
                outcomes[sid] = await store.create(header(sid))
            except StoreError as exc:
                outcomes[sid] = exc

        gate = await hold(gated)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "first")
            await held(gated)
            for sid in ("a", "exists", "owned", "faulty", "b"):
                nursery.start_soon(create, sid)
            await trio.testing.wait_all_tasks_blocked()
            gated.gate = None
            gate.set()
        assert sorted(batches[-1]) == ["a", "b", "exists", "faulty", "owned"]  # one transaction
        assert isinstance(outcomes["exists"], SessionAlreadyExistsError)
        assert isinstance(outcomes["owned"], SessionAlreadyOwnedError)
        assert isinstance(outcomes["faulty"], StoreError)
        assert "injected fault" in str(outcomes["faulty"])
        assert rows(tmp_path / "s.db", "owners") == ["a", "b", "first", "owned"]
        assert "faulty" not in rows(tmp_path / "s.db", "sessions")  # rolled back to its savepoint
        for sid in ("a", "b", "first"):
            handle = outcomes[sid]
            assert isinstance(handle, WriteHandle)
            await use(handle)
        await use(owner)
        gated.fail_owner_of = None
        await use(await store.create(header("faulty")))  # nothing of it was left behind


def creator(store: SqliteStore, handles: list[WriteHandle]) -> Callable[[str], Awaitable[None]]:
    """``create(sid)``: create session ``sid`` in ``store``, keeping its handle in ``handles``."""

    async def create(sid: str) -> None:
        handles.append(await store.create(header(sid)))

    return create


async def test_a_create_cancelled_while_queued_takes_nothing(
    tmp_path: Path, batches: list[list[str]], gated: type[Gated]
) -> None:
    async with SqliteStore(tmp_path / "s.db", connection_factory=Gated) as store:
        handles: list[WriteHandle] = []
        create = creator(store, handles)
        gate = await hold(gated)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "first")
            await held(gated)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as queued:
                    queued.start_soon(create, "cancelled")
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()
            gated.gate = None
            gate.set()
        assert batches == [["first"]]
        assert rows(tmp_path / "s.db", "sessions") == ["first"]
        await use(handles[0])
        await use(await store.create(header("cancelled")))


async def cancellable(scope: trio.CancelScope, create: Any, sid: str) -> None:
    with scope:
        await create(sid)


async def test_a_create_cancelled_while_its_transaction_runs_gives_the_session_back(
    tmp_path: Path, batches: list[list[str]], gated: type[Gated]
) -> None:
    async with SqliteStore(tmp_path / "s.db", connection_factory=Gated) as store:
        handles: list[WriteHandle] = []
        create = creator(store, handles)
        first, scope = await hold(gated), trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "first")
            await held(gated)
            nursery.start_soon(create, "leader")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(cancellable, scope, create, "cancelled")
            await trio.testing.wait_all_tasks_blocked()
            second = await hold(gated)
            first.set()  # "first" commits, then "leader" runs both claims, held
            await held(gated)
            scope.cancel()  # "cancelled" waits for its transaction, shielded
            await trio.testing.wait_all_tasks_blocked()
            gated.gate = None
            second.set()
        assert scope.cancelled_caught
        assert batches == [["first"], ["leader", "cancelled"]]
        assert sorted(h.session_id for h in handles) == ["first", "leader"]
        assert rows(tmp_path / "s.db", "owners") == ["first", "leader"]
        assert "cancelled" not in rows(tmp_path / "s.db", "sessions")  # given back, dropped
        for handle in handles:
            await use(handle)
        await use(await store.create(header("cancelled")))


async def test_a_transaction_that_outlasts_the_grace_gives_the_session_back_itself(
    tmp_path: Path, batches: list[list[str]], gated: type[Gated], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_claims, "CLAIM_GRACE", 0.01)
    async with SqliteStore(tmp_path / "s.db", connection_factory=Gated) as store:
        handles: list[WriteHandle] = []
        create = creator(store, handles)
        first, scope, gone = await hold(gated), trio.CancelScope(), trio.Event()

        async def create_gone() -> None:
            await cancellable(scope, create, "gone")
            gone.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "first")
            await held(gated)
            nursery.start_soon(create, "leader")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(create_gone)
            await trio.testing.wait_all_tasks_blocked()
            second = await hold(gated)
            first.set()
            await held(gated)
            scope.cancel()  # "gone" waits 0.01 s, then leaves the giving back to the leader
            await gone.wait()
            gated.gate = None
            second.set()
        assert scope.cancelled_caught
        assert batches == [["first"], ["leader", "gone"]]
        assert rows(tmp_path / "s.db", "owners") == ["first", "leader"]
        assert "gone" not in rows(tmp_path / "s.db", "sessions")
        for handle in handles:
            await use(handle)


async def test_a_leader_cancelled_before_its_transaction_hands_the_rest_on(
    tmp_path: Path, batches: list[list[str]], gated: type[Gated]
) -> None:
    async with SqliteStore(tmp_path / "s.db", connection_factory=Gated) as store:
        handles: list[WriteHandle] = []
        lock, unlock = store._connections.writer_lock, trio.Event()
        scope_a, scope_b = trio.CancelScope(), trio.CancelScope()

        async def create(sid: str) -> None:
            handles.append(await store.create(header(sid)))

        async def take_lock() -> None:
            async with lock:  # queued behind the running transaction (trio locks are fair)
                await unlock.wait()

        gate = await hold(gated)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "first")
            await held(gated)
            nursery.start_soon(cancellable, scope_a, create, "a")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(cancellable, scope_b, create, "b")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(take_lock)
            await trio.testing.wait_all_tasks_blocked()
            gated.gate = None
            gate.set()  # "first" ends; the lock goes to take_lock; "a" leads a and b, waits
            while not handles:
                await trio.sleep(0.001)
            await trio.testing.wait_all_tasks_blocked()
            scope_b.cancel()  # "b" is in a taken batch: it waits for it
            await trio.testing.wait_all_tasks_blocked()
            scope_a.cancel()  # the leader gives up before its transaction ran
            await trio.testing.wait_all_tasks_blocked()
            unlock.set()
        assert scope_a.cancelled_caught
        assert scope_b.cancelled_caught
        await use(await store.create(header("later")))  # runs alone: nothing orphaned
        assert batches == [["first"], ["later"]]
        assert rows(tmp_path / "s.db", "owners") == ["first"]
        assert rows(tmp_path / "s.db", "sessions") == ["first", "later"]
        for handle in handles:
            await use(handle)


async def test_a_create_whose_inherited_events_fail_gives_the_session_back(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        with pytest.raises(SequenceConflictError, match="gap"):
            await store.create(header("s1"), inherited_events=[ev(1)])  # a gap: refused
        assert rows(tmp_path / "s.db", "owners") == []
        assert rows(tmp_path / "s.db", "sessions") == []
        await use(await store.create(header("s1")))
