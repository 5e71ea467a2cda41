"""The session writer: commit delay without barriers, failing closes, store failures mid-turn."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel

from dsh_agent_loop import (
    AgentOptions,
    MemoryStore,
    Reply,
    ScriptedModel,
    StoreError,
    open_runtime,
    tool,
)
from dsh_agent_loop.session.writer import COMMIT_DELAY

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


class _Handle:
    """Delegates to a real handle; fails flush or close when armed."""

    def __init__(self, inner: Any, owner: FlakyStore) -> None:
        self._inner = inner
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def flush(self) -> None:
        if self._owner.fail_flush:
            raise StoreError("disk full (injected)")
        await self._inner.flush()

    async def close(self) -> None:
        if self._owner.fail_close:
            await self._inner.abort()
            raise StoreError("release failed (injected)")
        await self._inner.close()


class FlakyStore:
    """A MemoryStore whose write handles can be made to fail."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.fail_flush = False
        self.fail_close = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, header: Any, *, inherited_events: Any = ()) -> Any:
        return _Handle(await self.inner.create(header, inherited_events=inherited_events), self)


async def test_the_seed_is_committed_after_the_commit_delay_without_a_barrier(autojump_clock):
    store = MemoryStore()
    async with open_runtime(store=store, providers={"scripted": ScriptedModel()}) as rt:
        h = await rt.agents.create(options=OPTIONS)
        assert await store.stat(h.agent.session_id) is None  # nothing durable yet
        await trio.sleep(COMMIT_DELAY * 3)
        info = await store.stat(h.agent.session_id)
        assert info is not None
        assert info.event_count == 1  # session/end-seed


async def test_a_failing_close_is_raised_by_dispose_and_does_not_hang(autojump_clock):
    store = FlakyStore()
    async with open_runtime(store=store, providers={"scripted": ScriptedModel()}) as rt:
        h = await rt.agents.create(options=OPTIONS)
        store.fail_close = True
        with trio.fail_after(60), pytest.raises(StoreError, match="release failed"):
            await h.dispose()
        assert rt.agents.get("main") is None


@tool
async def touch() -> str:
    """Do nothing."""
    return "ok"


async def test_a_store_failure_mid_turn_reports_once_and_disposes_the_agent(autojump_clock):
    store = FlakyStore()
    errors: list[Any] = []
    model = ScriptedModel([Reply.tool_calls(("touch", {})), Reply.text("never")])
    async with open_runtime(store=store, providers={"scripted": model}, tools=[touch]) as rt:
        rt.hooks.on("agent/error", errors.append)
        h = await rt.agents.create(options=OPTIONS)
        store.fail_flush = True  # the flush before the tool runs fails
        h.agent.followup("go")
        with trio.fail_after(60):
            await h.agent.wait_idle()
            while rt.agents.get("main") is not None:
                await trio.sleep(0.01)
        events = h.agent.session.events
    assert [e.data["error"]["code"] for e in errors] == ["STORE_FAILED"]
    end = [e for e in events if e.type == "turn/end"][-1]
    assert end.data["reason"]["kind"] == "error"
    assert end.data["reason"]["error"]["code"] == "STORE_FAILED"
    assert not [e for e in events if e.type == "tool/result" and not e.data.get("error")]


async def test_a_full_batch_is_committed_at_once_without_a_barrier_or_the_timer(autojump_clock):
    # The session wakes its writer on the first pending event and again once the writer's
    # batch limit is pending: a long burst is committed in batches, not held for the delay.
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START
    from dsh_agent_loop.session.log import Session
    from dsh_agent_loop.session.writer import SessionWriter

    header = {"session_id": "s-1", "agent_id": "a", "created_at": "2026-01-01T00:00:00Z"}
    store = MemoryStore()
    handle = await store.create(header)
    session = Session(header, clock=trio.current_time)
    writer = SessionWriter(session, handle, commit_delay=3600.0, batch_limit=4)
    assert session.wake_limit == 4
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        for turn in range(1, 4):
            session.add(TURN_START, FrozenDict(turn=turn))
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        assert writer.statistics().commits == 0  # three pending: they wait for the delay
        session.add(TURN_START, FrozenDict(turn=4))  # the fourth reaches the limit
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        stats = writer.statistics()
        assert (stats.commits, stats.committed_seq) == (1, 3)
        assert trio.current_time() == 0.0  # no time passed: not the delay
        for turn in range(5, 9):  # four more: one more early commit
            session.add(TURN_START, FrozenDict(turn=turn))
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        assert writer.statistics().committed_seq == 7
        await writer.aclose()
    assert [e.seq for e in await (await store.open("s-1")).read()] == list(range(8))
