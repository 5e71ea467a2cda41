"""The session writer: commit delay, failing closes, store failures mid-turn, unexpected errors."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from dsh_agent_loop import (
    AgentClosedError,
    AgentOptions,
    MemoryStore,
    Reply,
    ScriptedModel,
    StoreError,
    invariants,
    open_runtime,
    tool,
)
from dsh_agent_loop._session.writer import COMMIT_DELAY
from dsh_agent_loop.testing import actor_of

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
    from dsh_agent_loop._session.log import Session
    from dsh_agent_loop._session.writer import SessionWriter
    from dsh_agent_loop.events import TURN_START

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


# -- any exception a handle raises is that session's STORE_FAILED (docs/design.md#group-commit) --


class _BrokenHandle:
    """Delegates to a real handle; raises ``error`` from the named method once armed."""

    def __init__(self, inner: Any, owner: _OneBrokenSession) -> None:
        self._inner = inner
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _check(self, method: str) -> None:
        if self._owner.armed and self._owner.method == method:
            raise self._owner.error

    async def append(self, events: Any) -> None:
        self._check("append")
        await self._inner.append(events)

    async def flush(self) -> None:
        self._check("flush")
        await self._inner.flush()


class _OneBrokenSession:
    """A MemoryStore whose handle for agent ``victim`` raises ``error`` once armed."""

    def __init__(self, victim: str, method: str, error: Exception) -> None:
        self.inner = MemoryStore()
        self.victim, self.method, self.error = victim, method, error
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, header: Any, *, inherited_events: Any = ()) -> Any:
        handle = await self.inner.create(header, inherited_events=inherited_events)
        return _BrokenHandle(handle, self) if header["agent_id"] == self.victim else handle


class _Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("no text")


@pytest.mark.parametrize(
    ("method", "error", "message"),
    [
        ("append", ValueError("cannot encode row"), "ValueError: cannot encode row"),
        ("flush", RuntimeError("store bug"), "RuntimeError: store bug"),
        ("append", sqlite3.OperationalError("database is locked"), "OperationalError: database"),
        ("flush", _Unprintable(), "session store failed: _Unprintable"),
    ],
)
async def test_an_unexpected_handle_error_stops_that_agent_only(
    autojump_clock, method, error, message
):
    store = _OneBrokenSession("main", method, error)
    main_model = ScriptedModel([Reply.tool_calls(("touch", {})), Reply.text("never")])
    other_model = ScriptedModel(
        [Reply.tool_calls(("touch", {})), Reply.text("other done")], latency=1.0
    )
    errors: list[Any] = []
    async with open_runtime(
        store=store,
        providers={"scripted": main_model, "other": other_model},
        tools=[touch],
        clock=trio.current_time,
    ) as rt:
        rt.hooks.on("agent/error", errors.append)
        main = await rt.agents.create(options=OPTIONS)
        other = await rt.agents.create(
            options=AgentOptions(id="other", provider="other", model="m")
        )
        store.armed = True  # from now on every commit of main's session fails
        main.agent.followup("go")
        other.agent.followup("go")
        with trio.fail_after(60):
            while rt.agents.get("main") is not None:  # the failing agent is disposed
                await trio.sleep(0.01)
            await other.agent.wait_idle()
        assert rt.agents.get("other") is other.agent
        failure = actor_of(main.agent).store_failure
        main_events = main.agent.session.events
        other_events = other.agent.session.events
    # the runtime block exited normally; only main failed, once, as STORE_FAILED
    assert [(e.data["agent_id"], e.data["error"]["code"]) for e in errors] == [
        ("main", "STORE_FAILED")
    ]
    assert message in errors[0].data["error"]["message"]
    assert isinstance(failure, StoreError)
    assert failure.code == "STORE_FAILED"
    assert failure.__cause__ is error
    end = [e for e in main_events if e.type == "turn/end"][-1]
    assert end.data["reason"]["kind"] == "error"
    assert end.data["reason"]["error"]["code"] == "STORE_FAILED"
    assert [e.data["reason"]["kind"] for e in other_events if e.type == "turn/end"] == ["completed"]
    assert invariants.check(main_events) == []
    assert invariants.check(other_events) == []
    stored = await (await store.inner.open(other.agent.session_id)).read()
    assert [e.data for e in stored] == [e.data for e in other_events]


async def test_a_store_failure_while_idle_stops_that_agent_at_once(autojump_clock):
    # An idle agent's queued events are committed by the commit timer, with no turn to report a
    # failure: the agent still emits agent/error and is disposed at once
    # (docs/design.md#store-failures).
    store = _OneBrokenSession("main", "append", OSError(28, "No space left on device"))
    errors: list[Any] = []
    model = ScriptedModel([Reply.text("fine")])
    async with open_runtime(
        store=store, providers={"scripted": model}, clock=trio.current_time
    ) as rt:
        rt.hooks.on("agent/error", errors.append)
        main = await rt.agents.create(options=OPTIONS)
        other = await rt.agents.create(
            options=AgentOptions(id="other", provider="scripted", model="m")
        )
        await main.agent.flush()
        store.armed = True
        main.agent.inject("context for later")  # no wake: only the timer commits it
        with trio.fail_after(5):
            while rt.agents.get("main") is not None:
                await trio.sleep(0.01)
        other.agent.followup("go")
        await other.agent.wait_idle()
        assert [
            e.data["reason"]["kind"] for e in other.agent.session.events if e.type == "turn/end"
        ] == ["completed"]
    assert [(e.data["agent_id"], e.data["error"]["code"]) for e in errors] == [
        ("main", "STORE_FAILED")
    ]
    assert "No space left on device" in errors[0].data["error"]["message"]
    assert isinstance(actor_of(main.agent).store_failure, StoreError)
    with pytest.raises(AgentClosedError):
        main.agent.followup("too late")


class _ScriptedHandle:
    """A MemoryStore handle with a lease, whose renew or close can raise."""

    def __init__(self, inner: Any, *, renew: Exception | None = None) -> None:
        self._inner = inner
        self._renew_error = renew
        self.close_error: Exception | None = None
        self.aborted = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def lease_ttl(self) -> float:
        return 3.0

    async def renew(self) -> None:
        if self._renew_error is not None:
            raise self._renew_error

    async def close(self) -> None:
        if self.close_error is not None:
            raise self.close_error
        await self._inner.close()

    async def abort(self) -> None:
        self.aborted = True
        await self._inner.abort()


async def _writer_on(handle_factory: Any, **kwargs: Any) -> tuple[Any, Any]:
    from dsh_agent_loop._session.log import Session
    from dsh_agent_loop._session.writer import SessionWriter

    header = {"session_id": "s-1", "agent_id": "a", "created_at": "2026-01-01T00:00:00Z"}
    handle = handle_factory(await MemoryStore().create(header))
    session = Session(header, clock=trio.current_time)
    return handle, SessionWriter(session, handle, **kwargs)


async def test_an_unexpected_renew_error_fails_the_session_not_the_nursery(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    bug = KeyError("lease row")
    handle, writer = await _writer_on(lambda h: _ScriptedHandle(h, renew=bug))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(1.5)  # past lease_ttl / 3: the writer renewed, and the renew raised
        assert isinstance(writer.failure, StoreError)
        assert writer.failure.code == "STORE_FAILED"
        assert writer.failure.__cause__ is bug
        writer.session.add(TURN_START, FrozenDict(turn=1))
        with pytest.raises(StoreError, match="KeyError") as raised:
            await writer.flush()
        assert raised.value is writer.failure
        await writer.aclose()
    assert handle.aborted  # a failed session's handle is aborted, not closed
    assert writer.statistics().failed


async def test_an_unexpected_close_error_is_reported_not_raised_into_the_nursery(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    handle, writer = await _writer_on(_ScriptedHandle)
    handle._renew_error = None
    bug = AttributeError("half-closed connection")
    handle.close_error = bug
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        writer.session.add(TURN_START, FrozenDict(turn=1))
        await writer.flush()
        await writer.aclose()
    assert writer.stopped
    assert isinstance(writer.failure, StoreError)
    assert writer.failure.__cause__ is bug
    writer.session.add(TURN_START, FrozenDict(turn=2))
    with pytest.raises(StoreError, match="AttributeError: half-closed connection"):
        await writer.flush()


async def test_a_raising_commit_callback_fails_the_session_not_the_nursery(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    def publish(batch: Any) -> None:
        raise RuntimeError("publisher bug")

    _, writer = await _writer_on(lambda h: h, on_commit=publish)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        writer.session.add(TURN_START, FrozenDict(turn=1))
        await writer.flush()  # committed: the barrier is released before publishing
        writer.session.add(TURN_START, FrozenDict(turn=2))
        with pytest.raises(StoreError, match="RuntimeError: publisher bug"):
            await writer.flush()
        await writer.aclose()
    assert writer.statistics().committed_seq == 0


class _Owner:
    """A writer's owner (what the agent is): told of commits and of a store failure."""

    def __init__(self) -> None:
        self.committed: list[int] = []
        self.failures: list[StoreError] = []

    def on_commit(self, batch: Any) -> None:
        self.committed.extend(e.seq for e in batch)

    def on_store_failure(self, failure: StoreError) -> None:
        self.failures.append(failure)


async def test_an_owner_is_told_of_commits_and_of_the_failure_once(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    owner = _Owner()
    store = FlakyStore()
    handle = await store.create({"session_id": "s-1"})
    from dsh_agent_loop._session.log import Session
    from dsh_agent_loop._session.writer import SessionWriter

    session = Session({"session_id": "s-1"}, clock=trio.current_time)
    writer = SessionWriter(session, handle, owner=owner)
    assert session.waker is writer  # the session wakes the writer itself, no bound method
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        session.add(TURN_START, FrozenDict(turn=1))
        session.add(TURN_START, FrozenDict(turn=2))
        await writer.flush()
        assert owner.committed == [0, 1]
        assert not session.has_pending()
        store.fail_flush = True
        session.add(TURN_START, FrozenDict(turn=3))
        with pytest.raises(StoreError, match="disk full"):
            await writer.flush()
        assert [f.code for f in owner.failures] == ["STORE_FAILED"]
        assert owner.committed == [0, 1]
        await writer.aclose()
    assert writer.stopped
    await writer.aclose()  # closing a stopped writer returns at once
    assert len(owner.failures) == 1


async def test_a_parked_writer_is_woken_by_close_and_by_a_flush(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    _, writer = await _writer_on(lambda h: h)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(10)  # parked: nothing pending
        assert writer.statistics().commits == 0
        writer.session.add(TURN_START, FrozenDict(turn=1))
        await writer.flush()  # the barrier unparks it
        assert writer.statistics().committed_seq == 0
        waiters = []

        async def close() -> None:
            await writer.aclose()
            waiters.append("closed")

        nursery.start_soon(close)
        nursery.start_soon(close)  # two closers both wait for the one stop
    assert waiters == ["closed", "closed"]
    assert writer.stopped


async def test_a_writer_parked_in_a_cancelled_scope_ends_cleanly(autojump_clock):
    _, writer = await _writer_on(lambda h: h)
    with trio.move_on_after(1):
        await writer.run()  # parks; the deadline cancels it while parked
    assert writer.stopped
    assert writer.failure is None


# -- inline commits: a handle that commits without suspending (``commits_inline``) ----------


class _InlineHandle:
    """A MemoryStore handle that declares ``commits_inline``; notes the task of each commit."""

    commits_inline = True

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.tasks: list[trio.lowlevel.Task] = []
        self.fail: Exception | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, events: Any) -> None:
        self.tasks.append(trio.lowlevel.current_task())
        await self._inner.append(events)

    async def flush(self) -> None:
        if self.fail is not None:
            raise self.fail
        await self._inner.flush()


class _InheritedInline(_InlineHandle):
    """Inherits the declaration, but may suspend: committed by the writer task."""

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()
        await super().flush()


class _LyingInline(_InlineHandle):
    """Declares ``commits_inline`` on its own class, then suspends."""

    commits_inline = True

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()


async def _stored(writer: Any) -> list[int]:
    return [e.seq for e in await writer.handle._inner.read()]


async def test_a_flush_commits_inline_in_the_callers_task_while_the_writer_is_parked(
    autojump_clock,
):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    owner = _Owner()
    handle, writer = await _writer_on(_InlineHandle, owner=owner)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(1)  # the writer is parked
        writer.session.add(TURN_START, FrozenDict(turn=1))
        writer.session.add(TURN_START, FrozenDict(turn=2))
        await writer.flush()
        assert handle.tasks == [trio.lowlevel.current_task()]  # not the writer's task
        stats = writer.statistics()
        assert (stats.commits, stats.events_committed, stats.committed_seq) == (1, 2, 1)
        assert owner.committed == [0, 1]  # published before the flush returned
        assert await _stored(writer) == [0, 1]
        await writer.flush()  # nothing new: no commit
        assert writer.statistics().commits == 1
        await writer.aclose()
    assert writer.stopped


async def test_an_inherited_or_delegated_declaration_commits_in_the_writer_task(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    for wrap in (_InheritedInline, lambda h: _Handle(_InlineHandle(h), FlakyStore())):
        handle, writer = await _writer_on(wrap)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.sleep(1)
            writer.session.add(TURN_START, FrozenDict(turn=1))
            await writer.flush()
            tasks = handle.tasks if isinstance(handle, _InlineHandle) else handle._inner.tasks
            assert len(tasks) == 1
            assert tasks[0] is not trio.lowlevel.current_task()  # the writer's task
            assert writer.statistics().committed_seq == 0
            await writer.aclose()
        assert writer.failure is None


async def test_an_inline_flush_stays_a_cancel_point_and_still_commits(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    handle, writer = await _writer_on(_InlineHandle)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(1)
        writer.session.add(TURN_START, FrozenDict(turn=1))
        with trio.CancelScope() as scope:
            scope.cancel()
            await writer.flush()
            pytest.fail("a cancelled flush returned")  # pragma: no cover
        assert scope.cancelled_caught
        assert writer.statistics().committed_seq == 0  # the commit was made all the same
        assert handle.tasks == [trio.lowlevel.current_task()]
        await writer.aclose()


async def test_an_inline_commit_that_fails_fails_the_session_once(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    owner = _Owner()
    handle, writer = await _writer_on(_InlineHandle, owner=owner)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(1)
        bug = OSError("disk gone")
        handle.fail = bug
        writer.session.add(TURN_START, FrozenDict(turn=1))
        with pytest.raises(StoreError, match="OSError: disk gone") as raised:
            await writer.flush()
        assert raised.value.__cause__ is bug
        writer.session.add(TURN_START, FrozenDict(turn=2))
        with pytest.raises(StoreError) as again:
            await writer.flush()
        assert again.value is raised.value
        assert len(owner.failures) == 1
        assert owner.committed == []
        await writer.aclose()
    assert writer.statistics().failed


async def test_a_declared_handle_that_suspends_fails_the_session(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    _, writer = await _writer_on(_LyingInline)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(1)
        writer.session.add(TURN_START, FrozenDict(turn=1))
        with pytest.raises(StoreError, match="commits_inline suspended"):
            await writer.flush()
        await writer.aclose()
    assert writer.statistics().committed_seq == -1


async def test_a_raising_commit_callback_inline_fails_the_session_after_the_barrier(
    autojump_clock,
):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop.events import TURN_START

    def publish(batch: Any) -> None:
        raise RuntimeError("publisher bug")

    _, writer = await _writer_on(_InlineHandle, on_commit=publish)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.sleep(1)
        writer.session.add(TURN_START, FrozenDict(turn=1))
        await writer.flush()  # committed: the barrier is released before publishing
        writer.session.add(TURN_START, FrozenDict(turn=2))
        with pytest.raises(StoreError, match="RuntimeError: publisher bug"):
            await writer.flush()
        await writer.aclose()
    assert writer.statistics().committed_seq == 0


async def test_the_commit_timer_commits_inline_without_waking_the_writer(autojump_clock):
    from dsh_agent_loop._frozen import FrozenDict
    from dsh_agent_loop._session.writer import CommitTimer
    from dsh_agent_loop.events import TURN_START

    timer = CommitTimer()
    handle, writer = await _writer_on(_InlineHandle, timer=timer)
    async with trio.open_nursery() as nursery:
        await nursery.start(timer.run)
        nursery.start_soon(writer.run)
        await trio.sleep(1)
        writer.session.add(TURN_START, FrozenDict(turn=1))
        assert timer.statistics().waiting_writers == 1
        await trio.sleep(COMMIT_DELAY * 3)
        assert timer.statistics().waiting_writers == 0
        assert writer.statistics().committed_seq == 0
        assert len(handle.tasks) == 1
        assert handle.tasks[0] is not trio.lowlevel.current_task()
        assert handle.tasks[0].name.endswith("CommitTimer.run")  # not the writer's task
        await writer.aclose()
        nursery.cancel_scope.cancel()


class _SlowCloseHandle:
    """A MemoryStore handle (declared to suspend) whose close takes a second of store time."""

    closing = 0
    most = 0

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def close(self) -> None:
        cls = type(self)
        cls.closing += 1
        cls.most = max(cls.most, cls.closing)
        try:
            await trio.sleep(1.0)
            await self._inner.close()
        finally:
            cls.closing -= 1


async def test_a_runtimes_writers_close_suspending_handles_a_bounded_number_at_a_time(
    autojump_clock,
):
    # Thousands of writers closing at once wait for a place (CLOSE_CONCURRENCY at a time), and
    # each one's close bound starts when it has one: none of them times out for waiting.
    from dsh_agent_loop._session.log import Session
    from dsh_agent_loop._session.writer import (
        CLOSE_CONCURRENCY,
        CLOSE_TIMEOUT,
        CommitTimer,
        SessionWriter,
    )

    store, timer = MemoryStore(), CommitTimer()
    count = CLOSE_CONCURRENCY * 12  # 12 waves of 1 s each: past CLOSE_TIMEOUT for the last
    assert count // CLOSE_CONCURRENCY > CLOSE_TIMEOUT
    writers = []
    for i in range(count):
        header = {"session_id": f"s-{i}", "agent_id": "a", "created_at": "2026-01-01T00:00:00Z"}
        handle = _SlowCloseHandle(await store.create(header))
        writers.append(SessionWriter(Session(header, clock=trio.current_time), handle, timer=timer))
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for writer in writers:
            nursery.start_soon(writer.run)
        await trio.testing.wait_all_tasks_blocked()
        for writer in writers:
            writer.request_close()
    assert _SlowCloseHandle.most == CLOSE_CONCURRENCY
    assert trio.current_time() - start == pytest.approx(12.0)
    assert [w.failure for w in writers if w.failure is not None] == []
    assert all(w.stopped for w in writers)
