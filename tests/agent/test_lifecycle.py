"""Create, resume and teardown (docs/design.md#lifecycle): rollback, registries, repair on resume,
disposal."""

from __future__ import annotations

import re

import attrs
import pytest
import trio

from dsh_agent_loop import (
    AgentAlreadyExistsError,
    AgentClosedError,
    AgentOptions,
    InvalidOptionError,
    MemoryStore,
    Reply,
    ScriptedModel,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    open_runtime,
)
from dsh_agent_loop.testing import actor_of

from ..session.logs import LogBuilder
from .conftest import OPTIONS, assert_well_formed, plain, turn_ends, types

HEADER = {"agent_id": "main", "created_at": "2024-01-01T00:00:00.000+00:00", "format_version": 1}


def runtime(model=None, **kwargs):
    kwargs.setdefault("store", MemoryStore())
    kwargs.setdefault("clock", trio.current_time)
    return open_runtime(providers={"scripted": model or ScriptedModel([])}, **kwargs)


async def test_create_publishes_and_announces(autojump_clock):
    seen = []
    async with runtime() as rt:
        for name in ("session/created", "agent/created", "agent/session-start"):
            rt.hooks.on(name, lambda e, name=name: seen.append((name, plain(e.data))))
        handle = await rt.agents.create(options=OPTIONS)
        agent = handle.agent
        assert re.fullmatch(r"main-session-[0-9a-f-]{36}", agent.session_id)
        assert rt.agents.get("main") is agent
        assert rt.agents.list() == [agent]
        assert [name for name, _ in seen] == [
            "session/created",
            "agent/created",
            "agent/session-start",
        ]
        assert seen[2][1]["source"] == "create"
        assert types(agent.session.events) == ["session/end-seed"]
        assert agent.status.value == "idle"


async def test_agent_ids_are_unique_among_live_agents(autojump_clock):
    async with runtime() as rt:
        await rt.agents.create(options=OPTIONS)
        with pytest.raises(AgentAlreadyExistsError):
            await rt.agents.create(options=OPTIONS)
        other = await rt.agents.create(
            options=AgentOptions(id="other", provider="scripted", model="m")
        )
        assert [a.id for a in rt.agents.list()] == ["main", "other"]
        assert other.agent.session_id != rt.agents.get("main").session_id


async def _assert_rolled_back(rt, sid):
    assert rt.agents.get("main") is None
    assert rt.agents.list() == []
    assert await rt.store.list() == []
    assert await rt.store.stat(sid) is None
    # the same agent id and session id can be used again
    handle = await rt.agents.create(session_id=sid, options=OPTIONS)
    assert rt.agents.get("main") is handle.agent
    await handle.dispose()
    assert [i.session_id for i in await rt.store.list()] == [sid]


async def test_a_raising_setup_rolls_the_creation_back(autojump_clock):
    async def setup(scope, agent):
        scope.hooks.on("agent/status", lambda e: None)
        raise RuntimeError("setup failed")

    async with runtime() as rt:
        with pytest.raises(RuntimeError, match="setup failed"):
            await rt.agents.create(session_id="s1", options=OPTIONS, setup=setup)
        await _assert_rolled_back(rt, "s1")


async def test_a_vetoing_session_created_listener_rolls_back(autojump_clock):
    def veto(event):
        raise PermissionError("not today")

    async with runtime() as rt:
        dispose = rt.hooks.on("session/created", veto)
        created = []
        rt.hooks.on("agent/created", created.append)
        with pytest.raises(PermissionError):
            await rt.agents.create(session_id="s1", options=OPTIONS)
        assert created == []
        dispose()
        await _assert_rolled_back(rt, "s1")


@pytest.mark.parametrize(
    "options",
    [
        AgentOptions(id="main", provider="scripted", model="m", max_tokens=0),
        AgentOptions(id="main", provider="scripted", model="m", max_tokens=-3),
        AgentOptions(id="main", provider="scripted", model="m", reasoning_effort=""),
        AgentOptions(id="", provider="scripted", model="m"),
        AgentOptions(id="main", provider="scripted", model="m", tools=("no-such-tool",)),
    ],
)
async def test_invalid_options_roll_back(autojump_clock, options):
    async with runtime() as rt:
        with pytest.raises(InvalidOptionError):
            await rt.agents.create(session_id="s1", options=options)
        await _assert_rolled_back(rt, "s1")


async def test_a_taken_session_id_is_refused(autojump_clock):
    from dsh_agent_loop import SessionAlreadyExistsError

    async with runtime(ScriptedModel([Reply.text("a")])) as rt:
        first = await rt.agents.create(session_id="s1", options=OPTIONS)
        first.agent.followup("go")
        await first.agent.wait_idle()
        await first.dispose()
        with pytest.raises(SessionAlreadyExistsError):
            await rt.agents.create(session_id="s1", options=OPTIONS)
        assert rt.agents.get("main") is None


async def test_dispose_is_idempotent_and_concurrent_callers_share_it(autojump_clock):
    disposed = []
    async with runtime() as rt:
        rt.hooks.on("agent/disposed", disposed.append)
        handle = await rt.agents.create(options=OPTIONS)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(handle.dispose)
        await handle.dispose()
        assert len(disposed) == 1
        assert rt.agents.get("main") is None
        assert actor_of(handle.agent).stopped
        # a disposed agent takes no message (AgentClosedError, tested further below)
        with pytest.raises(AgentClosedError):
            handle.agent.followup("ignored")
        await trio.sleep(1)
        assert "turn/start" not in types(handle.agent.session.events)


async def test_a_stale_disposer_cannot_remove_a_newer_agent(autojump_clock):
    model = ScriptedModel([Reply.text("still here")])
    async with runtime(model) as rt:
        old = await rt.agents.create(options=OPTIONS)
        await old.dispose()
        new = await rt.agents.create(options=OPTIONS)
        await old.dispose()
        assert rt.agents.get("main") is new.agent
        assert not actor_of(new.agent).stopped
        new.agent.followup("go")
        await new.agent.wait_idle()
        assert turn_ends(new.agent.session.events) == [{"kind": "completed"}]


async def test_scoped_hooks_and_tools_vanish_with_the_agent(autojump_clock):
    from dsh_agent_loop import tool

    @tool
    async def mine() -> str:
        return "x"

    async def setup(scope, agent):
        scope.hooks.on("agent/status", lambda e: None)
        scope.add_tool(mine)
        scope.persona = "scoped persona"

    async with runtime(ScriptedModel([Reply.text("a")])) as rt:
        handle = await rt.agents.create(options=OPTIONS, setup=setup)
        agent = handle.agent
        assert actor_of(agent).hooks.has("on", "agent/status")
        agent.followup("go")
        await agent.wait_idle()
        (request,) = rt.router.get("scripted").requests
        assert [t["name"] for t in request.tools] == ["mine"]
        assert request.messages[0]["content"][0]["text"] == "scoped persona"
        await handle.dispose()
        assert not actor_of(agent).hooks.has("on", "agent/status")
        assert actor_of(agent).scope.tools == {}
        assert not rt.hooks.has("on", "agent/status")


async def test_resume_rebuilds_the_inbox(autojump_clock):
    model = ScriptedModel([Reply.text("resumed work")])
    async with runtime(model) as rt:
        handle = await rt.agents.create(session_id="s1", options=OPTIONS)
        handle.agent.inject("step context")
        handle.agent.send("queued prompt", "next-turn", wake=False)
        await handle.dispose()
        sessions = []
        rt.hooks.on("agent/session-start", lambda e: sessions.append(e.data["source"]))
        again = await rt.agents.resume("s1", options=OPTIONS)
        agent = again.agent
        assert sessions == ["resume"]
        # queued next-turn work goes on after the resume
        await agent.wait_idle()
        assert turn_ends(agent.session.events) == [{"kind": "completed"}]
        request = model.requests[0]
        assert [m["content"][0]["text"] for m in request.messages if m["role"] == "user"] == [
            "step context",
            "queued prompt",
        ]
        header = [e for e in agent.session.events if e.type == "request/header"]
        # no request was ever made in this session: nothing to resume, the header is initial
        assert [e.data["reason"] for e in header] == ["initial"]
        # new message ids continue the session's counter
        assert agent.followup("more") == "m-3"
        assert_well_formed(agent.session.events)


async def test_resume_nothing_queued_stays_idle(autojump_clock):
    model = ScriptedModel([Reply.text("a")])
    async with runtime(model) as rt:
        handle = await rt.agents.create(session_id="s1", options=OPTIONS)
        handle.agent.inject("only next-step")
        await handle.dispose()
        again = await rt.agents.resume("s1", options=OPTIONS)
        await trio.sleep(1)
        assert again.agent.status.value == "idle"
        assert [m["id"] for m in again.agent.inbox.next_step] == ["m-1"]
        assert model.requests == []


async def test_resume_missing_and_owned_sessions(autojump_clock):
    async with runtime() as rt:
        with pytest.raises(SessionNotFoundError):
            await rt.agents.resume("nope", options=OPTIONS)
        assert rt.agents.get("main") is None
        handle = await rt.agents.resume("nope", options=OPTIONS, create_if_missing=True)
        assert handle.agent.session_id == "nope"
        handle.agent.inject("x")  # make it non-empty once flushed
        await handle.agent.flush()
        with pytest.raises(SessionAlreadyOwnedError):
            await rt.agents.resume(
                "nope", options=AgentOptions(id="second", provider="scripted", model="m")
            )
        assert rt.agents.get("second") is None


def crashed_log() -> LogBuilder:
    """A session that crashed in step 2 of turn 1 while running tools."""
    b = LogBuilder()
    b.seed_end()
    b.add(
        "agent/inbox/spliced",
        {
            "target": "next-turn",
            "start": 0,
            "removed_count": 0,
            "inserted": (
                {"role": "user", "id": "m-1", "content": ({"type": "text", "text": "go"},)},
            ),
        },
    )
    b.turn_start(1)
    b.add(
        "agent/inbox/spliced",
        {"target": "next-turn", "start": 0, "removed_count": 1, "inserted": ()},
    )
    b.step_start(1, 1)
    b.system(1, 1, "")
    b.user("m-1", "go")
    b.assistant(1, 1, calls=[("c0", "t", {})])
    call = b.tool_call(1, 1, "c0")
    b.tool_result(1, 1, "c0", call)
    b.step_end(1, 1)
    b.step_start(1, 2)
    b.assistant(
        1, 2, "working", calls=[("c1", "t", {"a": 1}), ("c2", "t", {"b": 2}), ("c3", "t", {})]
    )
    b.tool_call(1, 2, "c1", args='{"a": 1}')
    c2 = b.tool_call(1, 2, "c2", args='{"b": 2}')
    b.tool_result(1, 2, "c2", c2)
    # a follow-up queued while the turn ran survives the crash
    b.add(
        "agent/inbox/spliced",
        {
            "target": "next-turn",
            "start": 0,
            "removed_count": 0,
            "inserted": (
                {
                    "role": "user",
                    "id": "m-2",
                    "content": ({"type": "text", "text": "after crash"},),
                },
            ),
        },
    )
    return b


async def store_with(events, sid="s1"):
    store = MemoryStore()
    handle = await store.create({**HEADER, "session_id": sid})
    await handle.append(events)
    await handle.flush()
    await handle.close()
    return store


async def test_resume_repairs_an_interrupted_turn(autojump_clock):
    log = crashed_log().events
    store = await store_with(log)
    model = ScriptedModel([Reply.text("continuing")])
    async with runtime(model, store=store) as rt:
        handle = await rt.agents.resume("s1", options=OPTIONS)
        agent = handle.agent
        await agent.wait_idle()
        events = agent.session.events
        n = len(log)
        assert events[:n] == log
        assert types(events[n : n + 7]) == [
            "tool/result",  # c1: its tool/call is stored, the outcome is unknown
            "tool/call",  # c3: never started, a synthetic call first
            "tool/result",
            "step/end",
            "turn/end",
            "session/end-seed",
            "turn/start",  # the queued follow-up runs
        ]
        c1, c3_call, c3 = events[n], events[n + 1], events[n + 2]
        assert c1.data["message"]["call_id"] == "c1"
        assert c1.data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        assert c1.source_event_seqs == (
            next(e.seq for e in log if e.type == "tool/call" and e.data["call_id"] == "c1"),
        )
        assert c3_call.data["call_id"] == "c3"
        assert c3.data["error"]["code"] == "TOOL_NOT_STARTED"
        assert c3.source_event_seqs == (c3_call.seq,)
        assert plain(events[n + 3].data) == {"turn": 1, "step": 2}
        assert plain(events[n + 4].data) == {"turn": 1, "reason": {"kind": "interrupted"}}
        assert turn_ends(events) == [{"kind": "interrupted"}, {"kind": "completed"}]
        assert [e.data["turn"] for e in events if e.type == "turn/start"] == [1, 2]
        # the interrupted turn's messages reach the model, answered
        roles = [m["role"] for m in model.requests[0].messages]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "tool", "tool", "user"]
        assert_well_formed(events)
        await handle.dispose()
        # repair is idempotent: a second resume adds only its seed marker
        before = len(agent.session.events)
        again = await rt.agents.resume("s1", options=OPTIONS)
        added = again.agent.session.events[before:]
        assert types(added) == ["session/end-seed"]
        assert_well_formed(again.agent.session.events)


async def test_resume_of_an_open_turn_without_a_step(autojump_clock):
    b = LogBuilder()
    b.seed_end()
    b.turn_start(1)
    store = await store_with(b.events)
    async with runtime(store=store) as rt:
        handle = await rt.agents.resume("s1", options=OPTIONS)
        assert types(handle.agent.session.events) == [
            "session/end-seed",
            "turn/start",
            "turn/end",
            "session/end-seed",
        ]
        assert turn_ends(handle.agent.session.events) == [{"kind": "interrupted"}]


async def test_an_invalid_persisted_splice_fails_the_resume_and_releases_it(autojump_clock):
    b = LogBuilder()
    b.seed_end()
    b.add(
        "agent/inbox/spliced",
        {"target": "next-turn", "start": 3, "removed_count": 1, "inserted": ()},
    )
    store = await store_with(b.events)
    async with runtime(store=store) as rt:
        with pytest.raises(Exception, match="invalid persisted inbox splice at session seq 1"):
            await rt.agents.resume("s1", options=OPTIONS)
        assert rt.agents.get("main") is None
        # ownership was released: the session can be opened for write again
        handle = await store.open("s1", "write")
        await handle.close()


async def test_runtime_exit_flushes_and_releases_every_session(autojump_clock):
    store = MemoryStore()
    async with runtime(ScriptedModel([Reply.text("a")]), store=store) as rt:
        handle = await rt.agents.create(session_id="s1", options=OPTIONS)
        handle.agent.followup("go")
        handle.agent.inject("left over")
        await handle.agent.wait_idle()
        expected = handle.agent.session.events
    reader = await store.open("s1")
    assert await reader.read() == expected
    writer = await store.open("s1", "write")  # nobody owns it any more
    await writer.close()
    (info,) = await store.list()
    assert plain(info.last_turn_end) == {"kind": "completed"}
    assert info.event_count == len(expected)


async def test_a_sub_agent_records_its_parent_session(autojump_clock):
    async with runtime() as rt:
        parent = await rt.agents.create(options=OPTIONS)
        child = await rt.agents.with_initiator(parent.agent).create(
            options=AgentOptions(id="child", provider="scripted", model="m")
        )
        assert child.agent.session.header["parent_session_id"] == parent.agent.session_id
        assert child.agent.parent is parent.agent
        # the view shares the registry
        assert rt.agents.get("child") is child.agent
        explicit = await rt.agents.create(
            options=AgentOptions(id="child2", provider="scripted", model="m"),
            parent_agent=child.agent,
        )
        assert explicit.agent.session.header["parent_session_id"] == child.agent.session_id


@pytest.mark.parametrize(
    "name", ["agent/created", "agent/session-start", "agent/disposed", "session/disposed"]
)
async def test_a_raising_lifecycle_observer_breaks_nothing(autojump_clock, caplog, name):
    def broken(event):
        raise RuntimeError(f"the observer of {event.type} broke")

    async with runtime(ScriptedModel([Reply.text("fine")])) as rt:
        rt.hooks.on(name, broken)
        handle = await rt.agents.create(session_id="s1", options=OPTIONS)
        assert rt.agents.get("main") is handle.agent
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        await handle.dispose()
        assert rt.agents.get("main") is None
        assert actor_of(handle.agent).stopped
        events = handle.agent.session.events
        assert turn_ends(events) == [{"kind": "completed"}]
        (info,) = await rt.store.list()
        assert info.event_count == len(events)
        # ownership was released: the session can be resumed
        again = await rt.agents.resume("s1", options=OPTIONS)
        assert again.agent.session.events[: len(events)] == events
    assert f"the observer of {name} broke" in caplog.text  # logged, not lost


async def _let_tasks_step() -> None:
    # Tasks spawned before a checkpoint share its batch, which trio may run in either order;
    # the second checkpoint is in the next batch, after every one of them has taken a step.
    for _ in range(2):
        await trio.lowlevel.checkpoint()


async def test_runtime_statistics_count_live_agents_and_sessions(autojump_clock):
    async with runtime(ScriptedModel([Reply.text("hi")])) as rt:
        stats = rt.statistics()
        assert (stats.agents, stats.sessions, stats.start_failures) == (0, 0, 0)
        handle = await rt.agents.create(options=OPTIONS)
        await rt.agents.create(options=AgentOptions(id="other", provider="scripted", model="m"))
        await _let_tasks_step()
        stats = rt.statistics()
        assert (stats.agents, stats.sessions) == (2, 2)
        assert stats.pending_commits == 2  # both seeds wait for the group-commit timer
        await handle.agent.flush()
        assert rt.statistics().pending_commits == 1
        await handle.dispose()
        assert (rt.statistics().agents, rt.statistics().sessions) == (1, 1)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            stats.agents = 5  # type: ignore[misc]


async def test_agents_with_the_same_options_share_one_header_options_record(autojump_clock):
    async with open_runtime(providers={"scripted": ScriptedModel([])}) as rt:
        a = await rt.agents.create(options=AgentOptions(id="a", provider="scripted", model="m"))
        b = await rt.agents.create(options=AgentOptions(id="b", provider="scripted", model="m"))
        c = await rt.agents.create(options=AgentOptions(id="c", provider="scripted", model="x"))
        record = a.agent.session.header["options"]
        assert record == {"provider": "scripted", "model": "m"}
        assert b.agent.session.header["options"] is record  # shared, not one copy per agent
        assert c.agent.session.header["options"]["model"] == "x"


async def test_runtime_exit_disposes_idle_busy_and_nested_agents_once_each(autojump_clock):
    # idle agents are torn down in one batch, a busy one and a parent with a child on their own
    disposed = []
    store = MemoryStore()
    model = ScriptedModel([Reply.text("done"), Reply.hang(after_text="busy")])
    async with runtime(model, store=store) as rt:
        rt.hooks.on("agent/disposed", lambda e: disposed.append(e.data["agent_id"]))
        idle = [
            await rt.agents.create(
                session_id=f"idle-{n}",
                options=AgentOptions(id=f"idle-{n}", provider="scripted", model="m"),
            )
            for n in range(5)
        ]
        idle[0].agent.followup("done before exit")  # a turn that completes: its log is closed
        await idle[0].agent.wait_idle()
        parent = await rt.agents.create(session_id="parent", options=OPTIONS)
        child = await rt.agents.with_initiator(parent.agent).create(
            session_id="child", options=AgentOptions(id="child", provider="scripted", model="m")
        )
        busy = await rt.agents.create(
            session_id="busy", options=AgentOptions(id="busy", provider="scripted", model="m")
        )
        busy.agent.followup("hangs")
        await trio.sleep(1)
        assert busy.agent.status.value != "idle"
        assert [h.quiet for h in idle] == [True] * 5
        assert (parent.quiet, child.quiet, busy.quiet) == (False, True, False)
    assert sorted(disposed) == sorted([*(f"idle-{n}" for n in range(5)), "main", "child", "busy"])
    assert disposed.index("child") < disposed.index("main")  # the child's log closes first
    for handle in [*idle, parent, child, busy]:
        assert actor_of(handle.agent).stopped
        assert rt.agents.get(handle.agent.id) is None
        writer = await store.open(handle.session_id, "write")  # ownership was released
        assert await writer.read() == handle.agent.session.events  # everything committed
        await writer.close()
    assert turn_ends(busy.agent.session.events) == [{"kind": "aborted", "cause": "disposed"}]
    assert_well_formed(idle[0].agent.session.events)


async def test_a_dispose_during_a_quiet_batch_waits_for_it(autojump_clock):
    from dsh_agent_loop._agent.handle import QuietTeardown

    disposed = []
    async with runtime() as rt:
        rt.hooks.on("agent/disposed", lambda e: disposed.append(e.data["agent_id"]))
        a = await rt.agents.create(options=OPTIONS)
        b = await rt.agents.create(options=AgentOptions(id="b", provider="scripted", model="m"))
        batch = QuietTeardown.begin([a, b])
        assert batch.holds(a)
        assert batch.holds(b)
        assert not a.quiet  # its teardown has begun
        with pytest.raises(AgentClosedError):
            a.agent.followup("too late")
        returned = []

        async def dispose_a():
            await a.dispose()
            returned.append(len(disposed))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(dispose_a)
            await trio.lowlevel.checkpoint()
            assert returned == []  # waits for the batch
            nursery.start_soon(batch.finish)
        assert returned == [2]
        assert disposed == ["main", "b"]
        assert rt.agents.list() == []
        # a batch skips an agent whose teardown already began
        c = await rt.agents.create(options=AgentOptions(id="c", provider="scripted", model="m"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(c.dispose)
            while c.quiet:  # until its own teardown has begun (trio may run it a step later)
                await trio.lowlevel.checkpoint()
            late = QuietTeardown.begin([c])
            assert not late.holds(c)
            await late.finish()
        assert disposed == ["main", "b", "c"]


async def test_default_session_ids_are_distinct_random_uuids(autojump_clock):
    import uuid as uuid_module

    async with runtime() as rt:
        ids = set()
        for n in range(300):
            handle = await rt.agents.create(
                options=AgentOptions(id=f"a{n}", provider="scripted", model="m")
            )
            sid = handle.session_id
            assert sid.startswith(f"a{n}-session-")
            assert uuid_module.UUID(sid[-36:]).version == 4
            assert re.fullmatch(
                r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00",
                handle.agent.session.header["created_at"],
            )
            ids.add(sid[-36:])
        assert len(ids) == 300


async def test_header_options_holding_a_list_are_shared_and_frozen(autojump_clock):
    async with runtime() as rt:
        options = [
            AgentOptions(id=i, provider="scripted", model="m", require_approval={"x", "y"})
            for i in ("a", "b")
        ]
        a, b = [await rt.agents.create(options=o) for o in options]
        record = a.agent.session.header["options"]
        assert record["require_approval"] == ("x", "y")
        assert b.agent.session.header["options"] is record


def test_session_id_suffixes_are_version_4_uuids_of_random_bits() -> None:
    import uuid as uuid_module

    from dsh_agent_loop._agent._stamps import uuid4_text

    texts = [uuid4_text() for _ in range(2000)]
    for text in texts:
        parsed = uuid_module.UUID(text)
        assert str(parsed) == text  # canonical: lower-case hex, 8-4-4-4-12
        assert parsed.version == 4
        assert parsed.variant == uuid_module.RFC_4122
    assert len(set(texts)) == len(texts)
    # the 122 random bits vary: every other hex digit takes more than one value
    for i in (j for j in range(36) if j not in (8, 13, 14, 18, 23)):
        assert len({t[i] for t in texts}) > 1, i
    assert {t[19] for t in texts} == set("89ab")


async def test_created_at_is_the_creation_time_to_the_millisecond(autojump_clock):
    from datetime import UTC, datetime, timedelta

    async with runtime() as rt:
        stamps = []
        for n in range(50):
            before = datetime.now(UTC)
            handle = await rt.agents.create(
                options=AgentOptions(id=f"a{n}", provider="scripted", model="m")
            )
            after = datetime.now(UTC)
            created = datetime.fromisoformat(handle.agent.session.header["created_at"])
            assert before - timedelta(milliseconds=1) < created <= after
            stamps.append(handle.agent.session.header["created_at"])
        assert stamps == sorted(stamps)


async def test_every_session_seeds_with_the_same_end_seed_payload(autojump_clock):
    async with runtime() as rt:
        handles = [
            await rt.agents.create(options=AgentOptions(id=f"a{n}", provider="scripted", model="m"))
            for n in range(2)
        ]
        seeds = [h.agent.session.events[0] for h in handles]
        assert [s.type for s in seeds] == ["session/end-seed"] * 2
        assert seeds[0].data == {}
        assert seeds[0].data is seeds[1].data  # one frozen payload, not one per session
