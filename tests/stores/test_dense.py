"""Stored seqs that are not dense are ``StoreCorruptError``, naming the session and the seq.

Rows are deleted, added or edited behind the store's back, with ``sqlite3`` or ``psycopg``
directly (another program, a hand repair gone wrong). Then ``open(id, "read")``,
``open(id, "write")`` and a handle's ``read()`` raise ``StoreCorruptError`` (code
``STORE_CORRUPT``), never a bare ``ValueError`` and never a log that silently skips or jumps;
the failed write open takes no ownership; the other sessions of the store go on; and a runtime
resuming the session fails with that error while its other agents keep working.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import attrs
import psycopg
import pytest

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, open_runtime
from dsh_agent_loop._errors import StoreCorruptError, StoreError
from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.stores import SqliteStore

from .conftest import drop_pg_tables, ev, header, new_pg_prefix, postgres_dsn


@attrs.frozen
class Place:
    """A store on a location, and a way to run SQL on its tables (``{p}``: the prefix)."""

    backend: str
    make: Callable[[], SessionStore]
    run_sql: Callable[[str], None]

    def insert(self, sid: str, seq: int) -> None:
        """Insert a well-formed event row at ``seq``."""
        text = event_to_json(ev(seq)).replace("'", "''")
        columns, values = "session_id, seq, type, json", f"'{sid}', {seq}, 'user/message', '{text}'"
        if self.backend == "postgres":
            columns, values = columns + ", hash", values + ", '\\x00'::bytea"
        self.run_sql(f"INSERT INTO {{p}}events ({columns}) VALUES ({values})")

    def delete(self, sid: str, seq: int) -> None:
        self.run_sql(f"DELETE FROM {{p}}events WHERE session_id='{sid}' AND seq={seq}")

    def move(self, sid: str, seq: int, to: int) -> None:
        """Replace the row at ``seq`` by a well-formed one at ``to``."""
        self.delete(sid, seq)
        self.insert(sid, to)


@pytest.fixture(params=["sqlite", "postgres"])
async def place(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Place]:
    if request.param == "sqlite":
        path = tmp_path / "s.db"

        def run_sqlite(statement: str) -> None:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                conn.execute(statement.replace("{p}", ""))
            finally:
                conn.close()

        yield Place("sqlite", lambda: SqliteStore(path), run_sqlite)
        return
    from dsh_agent_loop.stores.postgres import PostgresStore

    dsn, prefix = postgres_dsn(), new_pg_prefix()

    def run_pg(statement: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(statement.replace("{p}", prefix).encode())

    try:
        yield Place("postgres", lambda: PostgresStore(dsn, table_prefix=prefix), run_pg)
    finally:
        drop_pg_tables(dsn, prefix)


async def seed(store: SessionStore, sid: str, n: int) -> None:
    handle = await store.create(header(sid))
    await handle.append([ev(i) for i in range(n)])
    await handle.close()


#: How each case damages session s1 (events 0..4), and what the error must say.
DAMAGE: dict[str, tuple[Callable[[Place], None], str]] = {
    "middle-row-deleted": (
        lambda place: place.delete("s1", 2),
        "seq 2 is missing (the next stored seq is 3)",
    ),
    "foreign-seq-1000": (
        lambda place: place.insert("s1", 1000),
        "seq 5 is missing (the next stored seq is 1000)",
    ),
    "row-renumbered": (
        lambda place: place.run_sql("UPDATE {p}events SET seq=7 WHERE session_id='s1' AND seq=3"),
        "seq 3 is missing (the next stored seq is 4)",
    ),
    "negative-seq": (
        lambda place: place.insert("s1", -1),
        "seq -1 is stored where seq 0 belongs",
    ),
    "last-and-foreign": (  # the count of rows is right: only the seqs are not
        lambda place: place.move("s1", 4, 9),
        "seq 4 is missing (the next stored seq is 9)",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
async def test_seqs_not_dense_are_store_corrupt_naming_session_and_seq(
    place: Place, case: str
) -> None:
    damage, named = DAMAGE[case]
    store = place.make()
    try:
        await seed(store, "s1", 5)
        await seed(store, "s2", 2)
        reader = await store.open("s1", "read")  # opened before the damage
        damage(place)

        for attempt in (lambda: store.open("s1", "read"), lambda: store.open("s1", "write")):
            with pytest.raises(StoreCorruptError) as info:
                await attempt()
            assert info.value.code == "STORE_CORRUPT"
            assert isinstance(info.value, StoreError)
            assert "session 's1'" in str(info.value)
            assert named in str(info.value)
        with pytest.raises(StoreCorruptError, match="session 's1'") as info:
            await reader.read()
        assert named in str(info.value)

        # the other session of the same store goes on: it opens, appends and reads back
        other = await store.open("s2", "write")
        await other.append([ev(2)])
        await other.close()
        again = await store.open("s2", "read")
        assert await again.read() == [ev(0), ev(1), ev(2)]
        # and another store object sees the same (the failed opens left nothing owned)
        second = place.make()
        try:
            with pytest.raises(StoreCorruptError, match="session 's1'"):
                await second.open("s1", "write")
            fresh = await second.create(header("s3"))
            await fresh.append([ev(0)])
            await fresh.close()
        finally:
            await second.aclose()
    finally:
        await store.aclose()


async def test_what_is_intact_stays_readable_and_a_repair_reopens(place: Place) -> None:
    """A gap fails only the reads that cross it; the failed opens took no ownership."""
    store = place.make()
    try:
        await seed(store, "s1", 5)
        reader = await store.open("s1", "read")
        place.delete("s1", 2)
        assert await reader.read(0, 2) == [ev(0), ev(1)]  # before the gap: intact
        with pytest.raises(StoreCorruptError, match="seq 2 is missing"):
            await reader.read(1, 2)  # seqs 1 and 2 asked: 1 and 3 found
        with pytest.raises(StoreCorruptError, match="seq 2 is missing"):
            await reader.read(2)
        with pytest.raises(StoreCorruptError, match="seq 2 is missing"):
            await store.open("s1", "write")
        place.insert("s1", 2)  # put the row back by hand: the session opens for write at once
        handle = await store.open("s1", "write")
        stored = await handle.read()
        assert [e.seq for e in stored] == [0, 1, 2, 3, 4]
        await handle.append([ev(5)])
        await handle.close()
    finally:
        await store.aclose()


async def test_an_event_whose_own_seq_is_not_its_rows_is_store_corrupt(place: Place) -> None:
    """The row's seq is in place, but the event's JSON says another: reads refuse it."""
    store = place.make()
    try:
        await seed(store, "s1", 5)
        place.run_sql(
            "UPDATE {p}events SET json = replace(json, '\"seq\":3,', '\"seq\":9,')"
            " WHERE session_id='s1' AND seq=3"
        )
        reader = await store.open("s1", "read")  # the counts are right
        with pytest.raises(StoreCorruptError, match="seq 9 is stored where seq 3 belongs"):
            await reader.read()
        writer = await store.open("s1", "write")
        with pytest.raises(StoreCorruptError, match="session 's1'"):
            await writer.read()
        await writer.abort()
    finally:
        await store.aclose()


async def test_a_runtime_resuming_a_corrupt_session_fails_and_its_other_agents_go_on(
    place: Place,
) -> None:
    model = ScriptedModel([Reply.text("ok")], loop=True)
    options = {sid: AgentOptions(id=sid, provider="s", model="m") for sid in ("bad", "good")}
    async with open_runtime(store=place.make(), providers={"s": model}) as rt:
        for sid in ("bad", "good"):
            handle = await rt.agents.create(session_id=sid, options=options[sid])
            handle.agent.followup("hello")
            await handle.agent.wait_idle()
    place.delete("bad", 3)

    async with open_runtime(store=place.make(), providers={"s": model}) as rt:
        good = await rt.agents.resume("good", options=options["good"])
        with pytest.raises(StoreCorruptError) as info:
            await rt.agents.resume("bad", options=options["bad"])
        assert "session 'bad'" in str(info.value)
        assert "seq 3 is missing" in str(info.value)
        with pytest.raises(StoreCorruptError, match="seq 3 is missing"):  # and again: not owned
            await rt.agents.resume("bad", options=options["bad"])
        before = len(good.agent.session.events)
        good.agent.followup("still there?")
        await good.agent.wait_idle()
        ends = [e for e in good.agent.session.events[before:] if e.type == "turn/end"]
        assert [e.data["reason"] for e in ends] == [{"kind": "completed"}]
