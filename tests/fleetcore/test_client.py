"""The fleet client and an in-process worker: delivery, results, commands, exactly once.

See docs/design.md#fleet-clients and docs/design.md#fleet-workers. Each test runs a worker
runtime and a client in one trio run, each with its own store object on the same database (as
two processes would); tests/fleet holds the cross-process ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    ApprovalPendingError,
    FleetOptions,
    InvalidOptionError,
    LimitExceededError,
    Reply,
    Runtime,
    ScriptedModel,
    SessionAlreadyExistsError,
    SessionNotFoundError,
    TurnFailedError,
    invariants,
    open_client,
    open_runtime,
)
from dsh_agent_loop.events import INBOX_SPLICED, Event
from dsh_agent_loop.fleet import FleetClient, FleetCommandError
from dsh_agent_loop.stores import SessionStore

OPTIONS = AgentOptions(id="bot", provider="scripted", model="m")
Factory = Callable[[], SessionStore]


@asynccontextmanager
async def worker(
    factory: Factory, replies: Sequence[Any] = (Reply.text("hello"),), **fleet: Any
) -> AsyncIterator[Runtime]:
    model = ScriptedModel(list(replies), loop=True)
    options = FleetOptions(**{"idle_unload_s": 60.0, "drain_timeout_s": 5.0, **fleet})
    async with open_runtime(store=factory(), providers={"scripted": model}, fleet=options) as rt:
        yield rt


async def stored(client: FleetClient, sid: str) -> list[Event]:
    handle = await client.store.open(sid, "read")
    try:
        return await handle.read()
    finally:
        await handle.close()


def inserted_ids(events: Sequence[Event]) -> list[str]:
    return [m["id"] for e in events if e.type == INBOX_SPLICED for m in e.data.get("inserted", ())]


async def test_run_returns_the_turn_that_claimed_the_message(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        async with worker(fleet_store):
            result = await client.run(sid, "hi", timeout=30)
            again = await client.run(sid, "and again", timeout=30)
        assert (result.text, result.turn, again.turn) == ("hello", 1, 2)
        assert result.message_id is not None
        assert result.message_id.startswith("msg-")
        events = await stored(client, sid)
        assert inserted_ids(events) == [result.message_id, again.message_id]
        assert invariants.check(events) == []


async def test_a_failed_turn_raises_as_agent_run_does(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(AgentOptions(id="bot", provider="scripted"))  # no model
        async with worker(fleet_store):
            with pytest.raises(TurnFailedError, match="provider and a model"):
                await client.run(sid, "hi", timeout=30)


@attrs.frozen
class Verdict:
    """A verdict."""

    label: str
    score: int


async def test_structured_output_comes_back_as_the_callers_type(fleet_store: Factory) -> None:
    replies = [
        Reply.tool_calls(("final_result", {"label": "ok", "score": 3})),
        Reply.tool_calls(("final_result", {"result": [1, 2]})),  # a list is wrapped
        Reply.tool_calls(("final_result", {"label": "ok"})),  # no score: a failed try
        Reply.text("no tool"),
        Reply.text("still none"),
    ]
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        async with worker(fleet_store, replies):
            result = await client.run(sid, "judge", output_type=Verdict, timeout=30)
            wrapped = await client.run(sid, "count", output_type=list[int], timeout=30)
            with pytest.raises(TurnFailedError, match="final_result"):
                await client.run(sid, "judge badly", output_type=Verdict, timeout=30)
    assert result.output == Verdict("ok", 3)
    assert wrapped.output == [1, 2]


async def test_send_is_idempotent_and_checks_its_input(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        with pytest.raises(SessionNotFoundError):
            await client.send("nobody", "hi")
        sid = await client.create(OPTIONS)
        with pytest.raises(SessionAlreadyExistsError):
            await client.create(OPTIONS, session_id=sid)
        with pytest.raises(InvalidOptionError, match="kind"):
            await client.send(sid, "hi", kind="shout")
        with pytest.raises(LimitExceededError):
            await client.send(sid, "x" * 1_000_001)
        with pytest.raises(LimitExceededError):
            await client.deny(sid, "c1", "x" * 1_000_001, wait=False)
        first = await client.send(sid, "hi", message_id="m1")
        second = await client.send(sid, "hi again", message_id="m1")
        assert first == second == "m1"
        async with worker(fleet_store):
            with trio.fail_after(30):
                while (await client.status()).undelivered:
                    await trio.sleep(0.05)
        assert inserted_ids(await stored(client, sid)) == ["m1"]


async def test_messages_reach_the_log_in_the_order_their_sends_returned(
    fleet_store: Factory,
) -> None:
    """A send that returned before another was called is inserted before it."""
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        clock = iter(range(1_000_000))
        spans: dict[str, tuple[int, int]] = {}

        async def sender(k: int) -> None:
            for i in range(10):
                called = next(clock)
                mid = await client.send(sid, f"{k}-{i}", message_id=f"s{k}-{i}")
                spans[mid] = (called, next(clock))

        async with worker(fleet_store):
            async with trio.open_nursery() as nursery:
                for k in range(3):
                    nursery.start_soon(sender, k)
            with trio.fail_after(30):
                while (await client.status()).undelivered:
                    await trio.sleep(0.05)
        logged = inserted_ids(await stored(client, sid))
    assert sorted(logged) == sorted(spans)
    place = {mid: i for i, mid in enumerate(logged)}
    for a, (_, returned) in spans.items():
        for b, (called, _) in spans.items():
            if returned < called:
                assert place[a] < place[b], (a, b)
    for k in range(3):  # each sender's own messages, in its order
        mine = [mid for mid in logged if mid.startswith(f"s{k}-")]
        assert mine == [f"s{k}-{i}" for i in range(10)]


async def test_a_lost_bookkeeping_write_never_inserts_a_message_twice(
    fleet_store: Factory,
) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        ids = [await client.send(sid, f"m{i}") for i in range(3)]
        async with worker(fleet_store):
            with trio.fail_after(30):
                while (await client.status()).undelivered:
                    await trio.sleep(0.05)
        # a worker died between its flush and its bookkeeping: the rows say "undelivered"
        await client.db.run(_forget_deliveries, sid)
        assert (await client.status()).undelivered == 3
        async with worker(fleet_store):
            with trio.fail_after(30):
                while (await client.status()).undelivered:
                    await trio.sleep(0.05)
        events = await stored(client, sid)
        assert inserted_ids(events) == ids
        assert invariants.check(events) == []


def _forget_deliveries(tx: Any, prefix: str, sid: str) -> None:
    tx.run(f"UPDATE {prefix}fleet_messages SET delivered_at = NULL WHERE session_id = ?", (sid,))


async def test_approve_and_deny_reach_the_worker(fleet_store: Factory) -> None:
    options = AgentOptions(id="bot", provider="scripted", model="m", require_approval=["look"])
    replies = [
        Reply.tool_calls(("look", {"path": "a"}, "c1")),
        Reply.text("looked"),
        Reply.tool_calls(("look", {"path": "b"}, "c2")),
        Reply.text("not looked"),
    ]

    async def look(path: str) -> str:
        """Look at a path."""
        return f"saw {path}"

    from dsh_agent_loop import tool

    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(options)
        model = ScriptedModel(replies)
        async with open_runtime(
            store=fleet_store(),
            providers={"scripted": model},
            tools=[tool(look)],
            fleet=FleetOptions(idle_unload_s=60.0),
        ):
            first = await client.run(sid, "look at a", timeout=30)
            assert first.reason["kind"] == "awaiting-approval"
            assert [r.call_id for r in first.pending_approvals] == ["c1"]
            with pytest.raises(ApprovalPendingError) as refused:
                await client.run(sid, "meanwhile", timeout=30)
            assert refused.value.call_ids == ("c1",)
            await client.approve(sid, "c1")
            with pytest.raises(FleetCommandError, match="c1"):
                await client.approve(sid, "c1")  # decided already: the worker says so
            second = await client.run(sid, "look at b", timeout=30)
            await client.deny(sid, "c2", "no")
            with trio.fail_after(30):
                while len(model.requests) < 4:
                    await trio.sleep(0.05)
        events = await stored(client, sid)
    results = [e.data for e in events if e.type == "tool/result"]
    assert [r["message"]["call_id"] for r in results] == ["c1", "c2"]
    assert "error" not in results[0]
    assert "error" in results[1]
    assert second.pending_approvals[0].call_id == "c2"
    assert invariants.check(events) == []


async def test_cancel_aborts_the_running_turn(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        async with worker(fleet_store, [Reply.hang()], drain_timeout_s=0.2):
            mid = await client.send(sid, "work")
            with trio.fail_after(30):
                async for event in client.events(sid):
                    if event.type == "step/start":
                        break
            await client.cancel(sid)
            with trio.fail_after(30):
                async for event in client.events(sid):
                    if event.type == "turn/end":
                        break
        events = await stored(client, sid)
    ends = [e.data["reason"] for e in events if e.type == "turn/end"]
    assert ends[0]["kind"] == "aborted"
    assert inserted_ids(events) == [mid]


async def test_status_shows_the_worker_and_the_backlog(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        await client.send(sid, "waiting")
        before = await client.status()
        assert (before.workers, before.sessions_waiting, before.undelivered) == ((), 1, 1)
        assert before.oldest_undelivered_age is not None
        async with worker(fleet_store, worker_id="w-1") as rt:
            assert rt.worker is not None
            assert rt.fleet is not None
            with trio.fail_after(30):
                while (await client.status()).undelivered:
                    await trio.sleep(0.05)
            during = await client.status()
            holder = await client.owner(sid)
        after = await client.status()
        assert await client.owner(sid) is None  # given back when the worker stopped
    assert holder == "w-1"
    assert [(w.worker_id, w.alive, w.state) for w in during.workers] == [("w-1", True, "running")]
    assert during.oldest_undelivered_age is None
    assert after.workers == ()  # a clean stop removes the worker's row


async def test_a_cancelled_run_withdraws_its_message(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        async with worker(fleet_store, [Reply.hang()], drain_timeout_s=0.2):
            await client.send(sid, "keeps the agent busy")
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:

                    async def call() -> None:
                        await client.run(sid, "queued behind it", message_id="late")

                    nursery.start_soon(call)
                    async for event in client.events(sid):
                        if "late" in inserted_ids([event]):
                            scope.cancel()  # the caller gives up while the message is queued
            with trio.fail_after(30):
                while (await client.status()).sessions_waiting:
                    await trio.sleep(0.05)
            events = await stored(client, sid)
    removals = [e.data for e in events if e.type == INBOX_SPLICED and e.data["removed_count"]]
    assert inserted_ids(events).count("late") == 1
    assert removals[-1]["outcome"] == "canceled"
    assert removals[-1]["target"] == "next-turn"


async def test_a_worker_resumes_what_its_former_self_held(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sid = await client.create(OPTIONS)
        async with worker(fleet_store, worker_id="w-1"):
            await client.run(sid, "hi", timeout=30)
        # as if w-1 had died holding the session: its row still names it
        await client.db.run(_assign, sid, "w-1")
        async with worker(fleet_store, worker_id="w-1") as rt:
            assert rt.worker is not None
            with trio.fail_after(30):
                while not rt.worker.live_agents:
                    await trio.sleep(0.05)
            assert rt.worker.live_agents == 1


def _assign(tx: Any, prefix: str, sid: str, worker_id: str) -> None:
    tx.run(
        f"UPDATE {prefix}fleet_sessions SET worker_id = ? WHERE session_id = ?", (worker_id, sid)
    )


async def test_sessions_of_one_agent_id_are_live_together(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        first, second = [await client.create(OPTIONS) for _ in range(2)]
        async with worker(fleet_store) as rt:
            assert rt.worker is not None
            with trio.fail_after(30):
                answers = [await client.run(sid, "hi") for sid in (first, second)]
            assert rt.worker.live_agents == 2  # neither waited for the other to unload
    assert [a.text for a in answers] == ["hello", "hello"]


async def test_postgresql_workers_wake_on_notify(fleet_store: Factory) -> None:
    """With a poll a minute apart, only the ``NOTIFY`` of a send can wake the worker."""
    async with fleet_store() as store, open_client(store) as client:
        if client.db.dialect != "postgresql":
            pytest.skip("SQLite has no notifications: its workers poll")
        sid = await client.create(OPTIONS)
        async with worker(fleet_store, poll_interval_s=3.0):  # fallback poll: 60 s
            with trio.fail_after(30):
                first = await client.run(sid, "wake up")  # claimed on the create's NOTIFY
                second = await client.run(sid, "and again")  # delivered on the send's
    assert (first.turn, second.turn) == (1, 2)


async def test_bulk_create_and_send(fleet_store: Factory) -> None:
    async with fleet_store() as store, open_client(store) as client:
        sids = await client.create_many([OPTIONS] * 5)
        with pytest.raises(SessionNotFoundError):
            await client.send_many([(sids[0], "a"), ("nobody", "b")])
        ids = await client.send_many([(sid, f"to {sid}") for sid in sids] + [(sids[0], "more")])
        assert len(set(ids)) == 6
        async with worker(fleet_store):
            with trio.fail_after(30):
                while (await client.status()).undelivered:
                    await trio.sleep(0.05)
        assert inserted_ids(await stored(client, sids[0])) == [ids[0], ids[5]]
        for sid in sids:
            assert inserted_ids(await stored(client, sid))
