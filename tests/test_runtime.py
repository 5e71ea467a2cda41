"""Leaving ``open_runtime`` under cancellation, and agents torn down from their own tasks.

- A cancel from outside the block (the scope around it, or the caller's nursery) while agents
  are mid-turn still stores every closer: the session writers outlive the drivers.
- A cancelled block leaves with a plain ``trio.Cancelled``, never one wrapped in a group.
- A tool or hook that disposes (or cancels) its own agent completes without deadlock.
- A disposed agent takes no message: ``AgentClosedError``, nothing appended, no id returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentClosedError,
    AgentLoopError,
    AgentOptions,
    Event,
    MemoryStore,
    Reply,
    ScriptedModel,
    SessionStore,
    SqliteStore,
    StoreError,
    ToolContext,
    invariants,
    open_runtime,
    tool,
)
from dsh_agent_loop.llm._base import TextDelta
from dsh_agent_loop.testing import actor_of

from .agent.conftest import OPTIONS, assert_well_formed, plain, turn_ends, types

N_AGENTS = 24
PARTIAL = "these words were already delivered"
KINDS = ("streaming", "in-tool", "between-steps")
#: Virtual seconds a self-teardown may take before the test calls it a deadlock.
DEADLOCK_GUARD = 600


# -- outer cancellation while agents are mid-turn --------------------------------------------------
class _Arrivals:
    """Agents that reached their mid-turn point; ``all_in`` is set once every one has."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.seen: set[str] = set()
        self.all_in = trio.Event()

    def arrive(self, agent_id: str) -> None:
        self.seen.add(agent_id)
        if len(self.seen) == self.expected:
            self.all_in.set()


def _kind(agent_id: str) -> str:
    return KINDS[int(agent_id.removeprefix("a")) % len(KINDS)]


def _model(kind: str) -> ScriptedModel:
    if kind == "streaming":  # streams PARTIAL, then waits until cancelled
        return ScriptedModel([Reply.hang(after_text=PARTIAL)])
    if kind == "in-tool":  # one call finishes, the other never returns
        return ScriptedModel([Reply.tool_calls(("quick", {}, "c-quick"), ("stuck", {}, "c-stuck"))])
    # a finished tool step; the pre-step hook of step 2 never returns
    return ScriptedModel([Reply.tool_calls(("quick", {}, "c-quick")), Reply.text("never sent")])


async def _agents_mid_turn(rt: Any, arrivals: _Arrivals) -> None:
    """Create ``N_AGENTS`` agents and set each one going; ``arrivals`` tells when all are stuck."""
    delivered: dict[str, str] = {}

    def on_frame(event: Event) -> None:
        data = event.data
        if data["frame"] == "chunk" and isinstance(data["chunk"], TextDelta):
            agent_id = data["agent_id"]
            delivered[agent_id] = delivered.get(agent_id, "") + data["chunk"].text
            if delivered[agent_id] == PARTIAL:
                arrivals.arrive(agent_id)

    async def pre_step(payload: Any, next: Any) -> Any:
        agent_id = payload["agent"].id
        if payload["step"] == 2 and _kind(agent_id) == "between-steps":
            arrivals.arrive(agent_id)
            await trio.sleep_forever()
        return await next(payload)

    rt.hooks.on("agent/assistant-stream", on_frame)
    rt.hooks.waterfall("agent/pre-step", pre_step)
    for i in range(N_AGENTS):
        handle = await rt.agents.create(
            session_id=f"s{i:02}", options=AgentOptions(id=f"a{i}", provider=f"p{i}", model="m")
        )
        handle.agent.followup("go")


def _tools(arrivals: _Arrivals) -> list[Any]:
    @tool
    async def quick() -> str:
        """Return at once."""
        return "done"

    @tool
    async def stuck(ctx: ToolContext) -> str:
        """Never return."""
        arrivals.arrive(ctx.agent_id)
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    return [quick, stuck]


async def _cancel_mid_turn(store: SessionStore, how: str) -> list[str]:
    """Cancel ``open_runtime`` from outside once every agent is mid-turn; returns what ran after.

    ``how`` is ``"scope"`` (the cancel scope around the block) or ``"nursery"`` (the caller's).
    """
    arrivals = _Arrivals(N_AGENTS)
    providers = {f"p{i}": _model(_kind(f"a{i}")) for i in range(N_AGENTS)}
    after: list[str] = []
    around = trio.CancelScope()

    async def caller() -> None:
        with around:
            async with open_runtime(
                store=store, providers=providers, tools=_tools(arrivals), max_parallel_tool_calls=2
            ) as rt:
                await _agents_mid_turn(rt, arrivals)
                await trio.sleep_forever()
            after.append("unreachable: the body was cancelled")
        after.append("after the cancelled scope")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        with trio.fail_after(DEADLOCK_GUARD):
            await arrivals.all_in.wait()
        if how == "scope":
            around.cancel()
        else:
            nursery.cancel_scope.cancel()
    return after


def _problems(kind: str, events: list[Event]) -> list[str]:
    """What is wrong with one stored log of ``_cancel_mid_turn`` (empty: all closers stored)."""
    problems = [str(v) for v in invariants.check(events, allow_open_turn=False)]
    if turn_ends(events) != [{"kind": "aborted", "cause": "disposed"}]:
        problems.append(f"turn ends {turn_ends(events)}")
    if types(events).count("step/start") != types(events).count("step/end"):
        problems.append("a step is left open")
    results = {
        e.data["message"]["call_id"]: plain(e.data.get("error"))
        for e in events
        if e.type == "tool/result"
    }
    if kind == "streaming":
        anchors = [
            e.data["message"]["content"]
            for e in events
            if e.type == "assistant/message" and e.data.get("interrupted")
        ]
        if [[b["text"] for b in content] for content in anchors] != [[PARTIAL]]:
            problems.append(f"interrupted anchors {anchors}")
    elif kind == "in-tool":
        expected = {"c-quick": None, "c-stuck": {"name": "Aborted", "code": "ABORTED"}}
        if results != expected:
            problems.append(f"tool results {results}")
    elif results != {"c-quick": None} or types(events).count("step/start") != 1:
        problems.append(f"between steps: results {results}, {types(events)}")
    return problems


async def _stored_problems(store: SessionStore) -> dict[str, list[str]]:
    """Problems of every stored session, by session id (sessions without any left out)."""
    found: dict[str, list[str]] = {}
    infos = await store.list()
    assert len(infos) == N_AGENTS
    for info in infos:
        reader = await store.open(info.session_id, "read")
        try:
            events = await reader.read()
        finally:
            await reader.close()
        writer = await store.open(info.session_id, "write")  # ownership was released
        await writer.close()
        problems = _problems(_kind(info.agent_id), events)
        if problems:
            found[info.session_id] = problems
    return found


@pytest.mark.parametrize("how", ["scope", "nursery"])
async def test_outer_cancel_mid_turn_stores_every_closer_memory(autojump_clock, how):
    store = MemoryStore()
    after = await _cancel_mid_turn(store, how)
    assert after == (["after the cancelled scope"] if how == "scope" else [])
    lost = await _stored_problems(store)
    assert lost == {}, f"{len(lost)} of {N_AGENTS} sessions lost closers"


@pytest.mark.parametrize("how", ["scope", "nursery"])
async def test_outer_cancel_mid_turn_stores_every_closer_sqlite(tmp_path: Path, how):
    # Worker threads: no autojump clock here; every wait is on an event, none on time.
    path = tmp_path / "sessions.db"
    async with SqliteStore(path) as store:
        after = await _cancel_mid_turn(store, how)
    assert after == (["after the cancelled scope"] if how == "scope" else [])
    async with SqliteStore(path) as fresh:  # a fresh store object reads what was committed
        lost = await _stored_problems(fresh)
    assert lost == {}, f"{len(lost)} of {N_AGENTS} sessions lost closers"


# -- a cancelled block leaves as a plain Cancelled -------------------------------------------------
def _runtime(model: ScriptedModel, **kwargs: Any) -> Any:
    kwargs.setdefault("store", MemoryStore())
    kwargs.setdefault("clock", trio.current_time)
    return open_runtime(providers={"scripted": model}, **kwargs)


async def _hanging_body(rt: Any) -> None:
    handle = await rt.agents.create(options=OPTIONS)
    handle.agent.followup("go")
    await trio.sleep_forever()


async def test_a_cancelled_block_leaves_as_a_plain_cancelled(autojump_clock):
    seen: list[type[BaseException]] = []
    with trio.move_on_after(5) as scope:
        try:
            async with _runtime(ScriptedModel([Reply.hang(after_text="partial")])) as rt:
                await _hanging_body(rt)
        except trio.Cancelled as exc:  # not an exception group: this clause sees it
            seen.append(type(exc))
            raise
        except BaseExceptionGroup as group:  # the leak this guards against
            seen.append(type(group))
            raise
    assert scope.cancelled_caught
    assert seen == [trio.Cancelled]
    (session,) = await rt.store.list()
    assert plain(session.last_turn_end) == {"kind": "aborted", "cause": "disposed"}


async def test_a_cancelled_idle_runtime_leaves_as_a_plain_cancelled(autojump_clock):
    caught: list[BaseException] = []
    with trio.CancelScope() as scope:
        try:
            async with _runtime(ScriptedModel([])) as rt:
                await rt.agents.create(options=OPTIONS)
                scope.cancel()
                await trio.sleep_forever()
        except BaseException as exc:
            caught.append(exc)
            raise
    assert scope.cancelled_caught
    assert [type(e) for e in caught] == [trio.Cancelled]


async def _raise_from_the_body(rt: Any) -> None:
    handle = await rt.agents.create(options=OPTIONS)
    handle.agent.followup("go")
    await trio.sleep(1)
    raise KeyError("from the body")


async def test_the_body_exception_still_leaves_as_raised_while_agents_run(autojump_clock):
    runtime = _runtime(ScriptedModel([Reply.hang(after_text="partial")]))
    with pytest.raises(KeyError) as info:
        async with runtime as rt:
            await _raise_from_the_body(rt)
    assert info.value.args == ("from the body",)
    assert info.value.__context__ is None  # not chained to the runtime's internals
    (session,) = await rt.store.list()
    assert plain(session.last_turn_end) == {"kind": "aborted", "cause": "disposed"}


# -- an agent torn down from one of its own tools or hooks -----------------------------------------
Teardown = Callable[[Any, Any], Any]


async def _dispose(rt: Any, agent: Any) -> None:
    await rt.agents.handle(agent.id).dispose()


async def _cancel(rt: Any, agent: Any) -> None:
    agent.cancel(cause="self")
    await trio.lowlevel.checkpoint()


async def _dispose_all(rt: Any, agent: Any) -> None:
    await rt.agents.dispose_all()


@contextmanager
def _deadlock_guard(agent: Any) -> Iterator[None]:
    """Fail fast when a teardown deadlocks, instead of hanging the runtime's exit too."""
    try:
        with trio.fail_after(DEADLOCK_GUARD):
            yield
    except trio.TooSlowError:
        # A teardown stuck waiting for its own driver is shielded: release it by hand, so that
        # the runtime can exit and the test reports the deadlock.
        actor_of(agent)._stopped.set()
        raise


async def _assert_torn_down(rt: Any, handle: Any, *, disposed: bool) -> list[Event]:
    agent = handle.agent
    with _deadlock_guard(agent):
        await agent.wait_idle()
        if disposed:
            assert agent.closed  # the teardown was started from inside
            await handle.dispose()  # waits for it to complete
    events = agent.session.events
    assert_well_formed(events)
    cause = "disposed" if disposed else "self"
    assert turn_ends(events) == [{"kind": "aborted", "cause": cause}]
    assert (rt.agents.get("main") is None) is disposed
    assert actor_of(agent).stopped is disposed
    return events


@pytest.mark.parametrize(
    ("teardown", "disposed"), [(_dispose, True), (_dispose_all, True), (_cancel, False)]
)
async def test_a_tool_tearing_down_its_own_agent(autojump_clock, teardown, disposed):
    after: list[str] = []
    holder: dict[str, Any] = {}

    @tool
    async def leave() -> str:
        """Tear down the agent running this tool."""
        rt = holder["rt"]
        await teardown(rt, rt.agents.get("main"))
        after.append("the tool went on")
        return "left"

    model = ScriptedModel([Reply.tool_calls(("leave", {}, "c1")), Reply.text("never")])
    async with _runtime(model, tools=[leave]) as rt:
        holder["rt"] = rt
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("go")
        events = await _assert_torn_down(rt, handle, disposed=disposed)
        (result,) = [e for e in events if e.type == "tool/result"]
        assert plain(result.data["error"]) == {"name": "Aborted", "code": "ABORTED"}
        assert after == []  # cancelled at the teardown's checkpoint
        assert len(model.requests) == 1
    stored = await _stored(rt.store, handle.agent.session_id)
    assert stored == events


async def _stored(store: SessionStore, session_id: str) -> list[Event]:
    reader = await store.open(session_id, "read")
    try:
        return await reader.read()
    finally:
        await reader.close()


def _waterfall(teardown: Teardown, holder: dict[str, Any]) -> Any:
    async def fn(payload: Any, next: Any) -> Any:
        await teardown(holder["rt"], payload["agent"])
        return await next(payload)

    return fn


def _serial(teardown: Teardown, holder: dict[str, Any]) -> Any:
    async def fn(payload: Any) -> None:
        await teardown(holder["rt"], payload["agent"])

    return fn


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("waterfall", "agent/pre-step"),
        ("serial", "agent/turn-stopping"),
        ("waterfall", "tools/pre-execute"),
        ("waterfall", "tools/execute"),
    ],
)
@pytest.mark.parametrize(("teardown", "disposed"), [(_dispose, True), (_cancel, False)])
async def test_a_hook_tearing_down_its_own_agent(autojump_clock, kind, name, teardown, disposed):
    holder: dict[str, Any] = {}

    @tool
    async def noop() -> str:
        """Do nothing."""
        return "ok"

    model = ScriptedModel([Reply.tool_calls(("noop", {}, "c1")), Reply.text("done")])
    async with _runtime(model, tools=[noop]) as rt:
        holder["rt"] = rt
        make = _waterfall if kind == "waterfall" else _serial
        getattr(rt.hooks, kind)(name, make(teardown, holder))
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("go")
        events = await _assert_torn_down(rt, handle, disposed=disposed)
        assert invariants.check(await _stored(rt.store, handle.agent.session_id)) == []
    assert invariants.check(await _stored(rt.store, handle.agent.session_id)) == []
    assert turn_ends(events)[0]["kind"] == "aborted"


async def test_a_sub_agent_tool_disposing_its_parent_does_not_deadlock(autojump_clock):
    # Not its own tree: the child's tool waits for the parent's teardown, which completes.
    holder: dict[str, Any] = {}

    @tool
    async def end_parent() -> str:
        """Dispose the parent agent."""
        await holder["rt"].agents.handle("main").dispose()
        return "parent gone"

    model = ScriptedModel([Reply.tool_calls(("end_parent", {}, "c1")), Reply.text("ok")])
    async with _runtime(model, tools=[end_parent]) as rt:
        holder["rt"] = rt
        parent = await rt.agents.create(options=OPTIONS)
        child = await rt.agents.with_initiator(parent.agent).create(
            options=AgentOptions(id="child", provider="scripted", model="m")
        )
        with trio.fail_after(DEADLOCK_GUARD):
            child.agent.followup("go")
            await child.agent.wait_idle()
        assert rt.agents.get("main") is None
        # disposing a parent disposes its sub-agents: the calling child's turn ends there
        assert turn_ends(child.agent.session.events) == [{"kind": "aborted", "cause": "disposed"}]
        assert child.agent.closed


# -- a disposed agent takes no message -------------------------------------------------------------
@pytest.mark.parametrize("method", ["followup", "steer", "inject", "send"])
async def test_a_disposed_agent_raises_agent_closed(autojump_clock, method):
    async with _runtime(ScriptedModel([])) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        agent = handle.agent
        await handle.dispose()
        before = list(agent.session.events)
        with pytest.raises(AgentClosedError) as info:
            getattr(agent, method)("too late")
        assert isinstance(info.value, AgentLoopError)
        assert info.value.code == "AGENT_CLOSED"
        assert agent.session.events == before
        assert len(agent.inbox) == 0
        assert agent.status.value == "idle"


async def test_an_agent_being_disposed_already_refuses_messages(autojump_clock):
    outcomes: list[str] = []
    holder: dict[str, Any] = {}

    @tool
    async def wait() -> str:
        """Wait until cancelled."""
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    def on_status(event: Event) -> None:
        if event.data["status"] == "idle" and holder.get("disposing"):  # inside the teardown
            try:
                outcomes.append(f"accepted {holder['agent'].steer('while disposing')}")
            except AgentClosedError as exc:
                outcomes.append(f"refused {exc.code}")

    model = ScriptedModel([Reply.tool_calls(("wait", {}, "c1"))])
    async with _runtime(model, tools=[wait]) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        holder["agent"] = handle.agent
        rt.hooks.on("agent/status", on_status)
        handle.agent.followup("go")
        await trio.sleep(1)
        holder["disposing"] = True
        await handle.dispose()
        assert outcomes == ["refused AGENT_CLOSED"]
        logged = repr([e.data for e in handle.agent.session.events])
        assert "go" in logged
        assert "while disposing" not in logged  # nothing was appended for it


# -- a hung store cannot hang the runtime's exit ---------------------------------------------------
class _Stalling:
    """A write handle whose ``flush`` stalls for ``STALL`` seconds once ``stall`` is set."""

    STALL = 10_000.0

    def __init__(self, inner: Any, stall: trio.Event) -> None:
        self._inner = inner
        self._stall = stall

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def flush(self) -> None:
        if self._stall.is_set():
            await trio.sleep(self.STALL)
        await self._inner.flush()


class _StallingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.stall = trio.Event()

    async def create(self, header: Any, *, inherited_events: Any = ()) -> Any:
        handle = await super().create(header, inherited_events=inherited_events)
        return _Stalling(handle, self.stall)


async def test_a_hung_store_delays_the_runtime_exit_only_boundedly(autojump_clock):
    store = _StallingStore()
    start = trio.current_time()
    with pytest.raises(BaseExceptionGroup) as info:  # the teardown's failure, beside others
        async with _runtime(ScriptedModel([Reply.hang(after_text="partial")]), store=store) as rt:
            await _hang_then_stall(rt, store)
    elapsed = trio.current_time() - start
    assert elapsed < _Stalling.STALL / 10  # bounded by the runtime's own timeouts, not the store
    stuck = info.value.subgroup(lambda e: isinstance(e, StoreError) and "did not close" in str(e))
    assert stuck is not None, info.value


async def _hang_then_stall(rt: Any, store: _StallingStore) -> None:
    handle = await rt.agents.create(options=OPTIONS)
    await handle.agent.flush()
    store.stall.set()
    handle.agent.followup("go")
    await trio.sleep(1)


# -- a driver that fails still lets its writer commit and close ------------------------------------
async def test_a_failing_driver_closes_its_writer_and_fails_the_runtime(
    autojump_clock, monkeypatch
):
    from dsh_agent_loop._agent._actor import AgentActor

    def broken(self: Any) -> bool:
        raise RuntimeError("driver bug")

    monkeypatch.setattr(AgentActor, "has_work", broken)  # the driver asks it once woken
    store = MemoryStore()
    created: list[str] = []

    async def body() -> None:
        async with _runtime(ScriptedModel([]), store=store) as rt:
            handle = await rt.agents.create(options=OPTIONS)
            created.append(handle.agent.session_id)
            handle.agent.followup("go")
            await trio.sleep_forever()

    start = trio.current_time()
    with pytest.raises(BaseExceptionGroup) as info:
        await body()
    [sid] = created
    assert info.value.subgroup(lambda e: isinstance(e, RuntimeError)) is not None
    assert trio.current_time() - start < 10  # no bounded wait ran out: the writer closed at once
    stat = await store.stat(sid)
    assert stat is not None
    assert stat.event_count == 2  # the seed and the prompt, committed by the final commit
    again = await store.open(sid, "write")  # the writer released ownership
    await again.close()


async def test_opening_a_runtime_in_an_already_cancelled_scope_leaves_at_once(autojump_clock):
    entered = False
    with trio.fail_after(5):  # a hang here would be a shielded timer task never started
        with trio.CancelScope() as scope:
            scope.cancel()
            async with open_runtime(providers={"scripted": ScriptedModel([])}):
                entered = True
                await trio.sleep(1)
    assert scope.cancelled_caught
    assert entered  # the body ran, and its first checkpoint raised Cancelled


# -- a BaseException from a tool or a hook leaves open_runtime as itself -------------------------
class _Stop(BaseException):
    """A BaseException that is neither an Exception nor a cancellation."""


_STOPS: list[Callable[[], BaseException]] = [KeyboardInterrupt, lambda: SystemExit(3), _Stop]


async def _stopping_runtime(
    store: SessionStore, raised: Callable[[], BaseException], where: str
) -> None:
    """Agent ``b`` hangs mid-stream; agent ``a`` then raises ``raised`` from a tool or a hook."""

    @tool
    async def halt() -> str:
        """Halt."""
        raise raised()

    async def pre_step(payload: Any, next: Any) -> Any:
        if payload["agent"].id == "a":
            raise raised()
        return await next(payload)

    models = {
        "a": ScriptedModel([Reply.tool_calls(("halt", {}, "c1"))]),
        "b": ScriptedModel([Reply.hang(after_text=PARTIAL)]),
    }
    async with open_runtime(store=store, providers=models, tools=[halt]) as rt:
        b = await rt.agents.create(options=AgentOptions(id="b", provider="b", model="m"))
        async with b.agent.subscribe(types=("agent/assistant-stream",)) as frames:
            b.agent.followup("wait")
            async for frame in frames:
                if frame.data["frame"] == "chunk":
                    break
        if where == "hook":
            rt.hooks.waterfall("agent/pre-step", pre_step)
        a = await rt.agents.create(options=AgentOptions(id="a", provider="a", model="m"))
        await a.agent.run("go")


@pytest.mark.parametrize("raised", _STOPS, ids=["KeyboardInterrupt", "SystemExit", "custom"])
@pytest.mark.parametrize("where", ["tool", "hook"])
async def test_a_base_exception_leaves_as_itself_and_others_store_their_closers(
    tmp_path: Path, raised: Callable[[], BaseException], where: str
) -> None:
    store = SqliteStore(str(tmp_path / "s.db"))
    expected = type(raised())
    with trio.fail_after(60):
        with pytest.raises(BaseException) as info:
            await _stopping_runtime(store, raised, where)
    assert type(info.value) is expected  # itself: no group, no Cancelled beside it
    infos = {i.agent_id: i for i in await store.list()}
    assert set(infos) == {"a", "b"}
    for info_ in infos.values():
        handle = await store.open(info_.session_id, "read")
        events = await handle.read()
        assert_well_formed(events)  # every session's closers are stored
    assert infos["b"].last_turn_end is not None
    assert plain(infos["b"].last_turn_end)["kind"] == "aborted"
    await store.aclose()
