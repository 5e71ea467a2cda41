"""PostgreSQL: a lost connection is retried on a new one; ownership is judged by the epoch.

The store's connections carry an ``application_name`` of their own, and a second connection
ends exactly those backends with ``pg_terminate_backend`` — between appends, while the handle
is idle before a renew, right before a ``COMMIT`` — as a server restart or a failover would.
Each time the session goes on, and the stored log is exactly the appended events: nothing
lost, nothing twice. If the lease expired while the owner was cut off and another owner took
it, the reconnected owner learns it from the epoch and writes nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import attrs
import psycopg
import pytest
import trio

from dsh_agent_loop import AgentOptions, Event, Reply, ScriptedModel, invariants, open_runtime, tool
from dsh_agent_loop._errors import SessionOwnershipLostError, StoreError
from dsh_agent_loop.stores import _postgres_sync as pg
from dsh_agent_loop.stores.postgres import RETRY_DELAYS, PostgresStore, capped_backoff

from .conftest import drop_pg_tables, ev, header, new_pg_prefix, postgres_dsn

#: Short real waits: the database clock judges leases, and the retries wait for real.
FAST = (0.0, 0.01, 0.02, 0.05, 0.1)


# --- pure parts -------------------------------------------------------------------------------


def pg_error(sqlstate: str | None) -> psycopg.Error:
    cls = psycopg.OperationalError if sqlstate is None else psycopg.errors.lookup(sqlstate)
    return cls("injected")


@pytest.mark.parametrize(
    ("sqlstate", "lost", "retry"),
    [
        (None, True, True),  # no answer from the server
        ("08006", True, True),  # connection failure
        ("08003", True, True),  # connection does not exist
        ("57P01", True, True),  # admin shutdown: pg_terminate_backend, a fast shutdown
        ("57P02", True, True),  # crash shutdown
        ("57P03", True, True),  # cannot connect now: starting up
        ("40001", False, True),  # serialization failure
        ("55P03", False, True),  # lock not available
        ("53100", False, False),  # disk full
        ("23505", False, False),  # unique violation
    ],
)
def test_lost_connections_and_transient_errors_are_retryable(
    sqlstate: str | None, lost: bool, retry: bool
) -> None:
    exc = pg_error(sqlstate)
    assert exc.sqlstate == sqlstate
    assert pg.connection_lost(exc) is lost
    assert pg.retryable(exc) is retry


def test_the_default_backoff_is_capped_exponential() -> None:
    assert capped_backoff(0.5, 3.0, 5) == (0.5, 1.0, 2.0, 3.0, 3.0)
    assert RETRY_DELAYS == (0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.0, 2.0)
    with pytest.raises(ValueError, match="retry_delays"):
        PostgresStore("postgresql://x/y", retry_delays=(0.1, -1.0))


# --- ending the store's backends ------------------------------------------------------------------


@attrs.define
class Server:
    """The test database, and a way to end the backends of the stores it made."""

    dsn: str
    prefix: str
    app: str
    stores: list[PostgresStore] = attrs.Factory(list)

    def store(self, **options: Any) -> PostgresStore:
        dsn = f"{self.dsn}{'&' if '?' in self.dsn else '?'}application_name={self.app}"
        options.setdefault("retry_delays", FAST)
        store = PostgresStore(dsn, table_prefix=self.prefix, **options)
        self.stores.append(store)
        return store

    def terminate(self) -> int:
        """End every backend of this test's stores (never another test's); return how many."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name=%s",
                (self.app,),
            ).fetchall()
        return sum(1 for (ok,) in rows if ok)

    async def wait_gone(self) -> None:
        """Wait until the ended backends have left ``pg_stat_activity``."""

        def count() -> int:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name=%s", (self.app,)
                ).fetchone()
            assert row is not None
            return int(row[0])

        with trio.fail_after(5):
            while await trio.to_thread.run_sync(count):
                await trio.sleep(0.01)

    async def kill(self) -> None:
        assert await trio.to_thread.run_sync(self.terminate) > 0
        await self.wait_gone()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    dsn = postgres_dsn()
    server = Server(dsn, new_pg_prefix(), f"dsh_t_{secrets.token_hex(6)}")
    try:
        yield server
    finally:
        for store in server.stores:
            await store.aclose()
        drop_pg_tables(dsn, server.prefix)


async def log_of(server: Server, sid: str) -> list[Event]:
    store = server.store()
    handle = await store.open(sid, "read")
    try:
        return list(await handle.read())
    finally:
        await handle.close()
        await store.aclose()


# --- the session goes on ----------------------------------------------------------------------


async def test_backend_killed_between_appends(server: Server) -> None:
    store = server.store()
    handle = await store.create(header("s1"))
    await handle.append([ev(0), ev(1)])
    await handle.flush()
    await server.kill()
    await handle.append([ev(2)])
    await handle.flush()  # the pooled connection is dead: retried on a new one
    assert store.statistics().retries >= 1
    await server.kill()
    await handle.append([ev(3), ev(4)])
    await handle.close()
    assert await log_of(server, "s1") == [ev(i) for i in range(5)]


async def test_backend_killed_while_idle_before_a_renew(server: Server) -> None:
    store = server.store(lease_ttl=5.0)
    handle = await store.create(header("s1"))
    await handle.append([ev(0)])
    await handle.flush()
    await server.kill()
    await handle.renew()  # reconnects; the lease is still this handle's epoch
    await server.kill()
    info = await store.stat("s1")  # reads reconnect too
    assert info is not None
    assert info.event_count == 1
    await handle.append([ev(0), ev(1)])  # a retried batch: the stored prefix is skipped
    await handle.close()
    assert await log_of(server, "s1") == [ev(0), ev(1)]


def killing_commit(server: Server, kills: list[int]) -> type[pg.Conn]:
    """A connection class whose next ``COMMIT`` goes out on a backend just terminated."""

    class KilledAtCommit(psycopg.Connection[Any]):
        def commit(self) -> None:
            if kills and kills[0] > 0:
                kills[0] -= 1
                pid = self.info.backend_pid
                with psycopg.connect(server.dsn, autocommit=True) as conn:
                    conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            super().commit()

    return KilledAtCommit


@pytest.mark.parametrize("times", [1, 3])
async def test_backend_killed_during_a_commit(server: Server, times: int) -> None:
    kills: list[int] = []
    store = server.store(connection_class=killing_commit(server, kills))
    handle = await store.create(header("s1"))
    await handle.append([ev(0)])
    await handle.flush()
    kills.append(times)
    await handle.append([ev(1), ev(2)])
    # the COMMIT's connection is gone: the outcome is read back (not stored), then the batch
    # is sent again on a new connection, as often as the connection keeps dying
    await handle.flush()
    assert kills == [0]
    assert store.statistics().retries >= times
    await handle.close()
    assert await log_of(server, "s1") == [ev(0), ev(1), ev(2)]


async def test_retries_end_with_a_store_error_and_keep_the_events(server: Server) -> None:
    kills: list[int] = []
    store = server.store(connection_class=killing_commit(server, kills), retry_delays=(0.0, 0.0))
    handle = await store.create(header("s1"))
    kills.append(99)
    await handle.append([ev(0)])
    with pytest.raises(StoreError, match="nothing was stored") as info:
        await handle.flush()
    assert info.value.code == "STORE_FAILED"
    assert kills == [96]  # one try and two retries
    kills[0] = 0
    await handle.flush()  # the events stayed staged
    await handle.close()
    assert await log_of(server, "s1") == [ev(0)]


async def test_lease_taken_over_while_cut_off_is_detected_on_reconnect(server: Server) -> None:
    stale_store = server.store(lease_ttl=0.3)
    stale = await stale_store.create(header("s1"))
    await stale.append([ev(0)])
    await stale.flush()
    await server.kill()
    await trio.sleep(0.5)  # the lease expires while the owner is cut off

    new_store = server.store()
    owner = await new_store.open("s1", "write")
    await owner.append([ev(1, text="new owner")])
    await owner.flush()

    await stale.append([ev(1, text="stale owner")])
    with pytest.raises(SessionOwnershipLostError):
        await stale.flush()  # reconnects, and the lease check sees the newer epoch
    with pytest.raises(SessionOwnershipLostError):
        await stale.renew()
    with pytest.raises(SessionOwnershipLostError):
        await stale.close()
    await owner.close()
    assert await log_of(server, "s1") == [ev(0), ev(1, text="new owner")]


async def test_renew_after_takeover_while_cut_off_is_ownership_lost(server: Server) -> None:
    stale_store = server.store(lease_ttl=0.3)
    stale = await stale_store.create(header("s1"))
    await stale.append([ev(0)])
    await stale.flush()
    await server.kill()
    await trio.sleep(0.5)
    owner = await server.store().open("s1", "write")
    with pytest.raises(SessionOwnershipLostError):
        await stale.renew()  # the first call after the cut: reconnects, then is refused
    await stale.abort()
    await owner.close()


# --- an agent's turn ------------------------------------------------------------------------------


OPTIONS = AgentOptions(id="reconnecting", provider="s", model="m")


async def test_agent_turn_survives_killed_backends(server: Server) -> None:
    @tool
    async def work(n: int) -> str:
        """Do a unit of work (the store's backends die meanwhile)."""
        await server.kill()
        return f"work {n} done"

    model = ScriptedModel(
        [
            Reply.tool_calls(("work", {"n": 1}), text="first"),
            Reply.tool_calls(("work", {"n": 2}), text="second"),
            Reply.text("all done"),
        ]
    )
    errors: list[str] = []
    store = server.store()
    async with open_runtime(store=store, providers={"s": model}, tools=[work]) as rt:
        rt.hooks.on("agent/error", lambda n: errors.append(n.data["error"]["code"]))
        handle = await rt.agents.create("agent-s1", options=OPTIONS)
        await handle.agent.flush()
        await server.kill()  # idle between turns
        handle.agent.followup("please work")
        with trio.fail_after(30):
            await handle.agent.wait_idle()
        in_memory = list(handle.agent.session.events)
    assert errors == []
    stored = await log_of(server, "agent-s1")
    assert stored == in_memory
    assert [e.seq for e in stored] == list(range(len(stored)))
    assert invariants.check(stored, allow_open_turn=False) == []
    ends = [e.data["reason"]["kind"] for e in stored if e.type == "turn/end"]
    assert ends == ["completed"]
    assert store.statistics().retries >= 3
