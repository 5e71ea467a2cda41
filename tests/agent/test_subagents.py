"""Sub-agents (docs/design.md#sub-agents): parent links, cancel propagation, dispose order,
forks."""

from __future__ import annotations

import pytest
import trio

from dsh_agent_loop import (
    AgentAlreadyExistsError,
    AgentClosedError,
    AgentOptions,
    InvalidOptionError,
    MemoryStore,
    Reply,
    SessionNotFoundError,
    SqliteStore,
    TurnBudget,
    tool,
)
from dsh_agent_loop.events import SESSION_END_SEED

from .conftest import (
    assert_well_formed,
    hanging_tool,
    parent_child_runtime,
    plain,
    stored,
    turn_ends,
    types,
    user_texts,
)

PARENT = AgentOptions(id="main", provider="p", model="m")
CHILD = AgentOptions(id="child", provider="c", model="m")


# -- links ---------------------------------------------------------------------------------------
async def test_a_child_header_names_its_parent_and_the_parent_lists_it(autojump_clock):
    async with parent_child_runtime() as rt:
        parent = await rt.agents.create(options=PARENT)
        child = await rt.agents.create(options=CHILD, parent_agent=parent.agent)
        assert child.agent.session.header["parent_session_id"] == parent.session_id
        assert child.agent.parent is parent.agent
        assert parent.agent.children == (child.agent,)
        await child.dispose()
        assert parent.agent.children == ()
        assert "parent_session_id" not in parent.agent.session.header


async def test_resume_keeps_the_link_and_relinks_a_live_parent(autojump_clock):
    store = MemoryStore()
    async with parent_child_runtime(store=store) as rt:
        parent = await rt.agents.create(session_id="p1", options=PARENT)
        child = await rt.agents.create(session_id="c1", options=CHILD, parent_agent=parent.agent)
        await child.dispose()
        again = await rt.agents.resume("c1")  # no parent given: the header's, which is live
        assert again.agent.parent is parent.agent
        assert parent.agent.children == (again.agent,)
        assert again.agent.session.header["parent_session_id"] == "p1"
        await again.dispose()
        other = await rt.agents.create(session_id="o1", options=AgentOptions(id="x", **_pm()))
        with pytest.raises(InvalidOptionError, match="sub-agent of session 'p1'"):
            await rt.agents.resume("c1", parent_agent=other.agent)
        top = await rt.agents.create(session_id="t1", options=AgentOptions(id="t", **_pm()))
        await top.dispose()
        with pytest.raises(InvalidOptionError, match="of no agent"):
            await rt.agents.resume("t1", parent_agent=other.agent)
        assert rt.agents.get("t") is None
        assert parent.agent.children == ()
    async with parent_child_runtime(store=store) as rt:  # the parent is not live: resumed unlinked
        alone = await rt.agents.resume("c1")
        assert alone.agent.parent is None
        assert alone.agent.session.header["parent_session_id"] == "p1"


def _pm():
    return {"provider": "p", "model": "m"}


async def test_a_disposed_parent_takes_no_children(autojump_clock):
    async with parent_child_runtime() as rt:
        parent = await rt.agents.create(options=PARENT)
        await parent.dispose()
        with pytest.raises(AgentClosedError):
            await rt.agents.create(options=CHILD, parent_agent=parent.agent)
        assert rt.agents.get("child") is None


# -- cancel propagation --------------------------------------------------------------------------
async def _stuck_pair(rt, started, parent_budget=None):
    """A parent stuck in a hanging model call and its child stuck in a hanging tool."""
    options = (
        PARENT
        if parent_budget is None
        else AgentOptions(id="main", provider="p", model="m", turn_budget=parent_budget)
    )
    parent = await rt.agents.create(options=options)
    child = await rt.agents.create(options=CHILD, parent_agent=parent.agent)
    child.agent.followup("work")
    await started.wait()
    return parent, child


@pytest.mark.parametrize("path", ["cancel", "run-caller", "budget-seconds", "dispose"])
async def test_a_parent_cancel_reaches_a_child_stuck_in_a_hanging_tool(autojump_clock, path):
    started = trio.Event()
    budget = TurnBudget(max_seconds=5) if path == "budget-seconds" else None
    async with parent_child_runtime(
        parent=[Reply.hang()],
        child=[Reply.tool_calls(("hang", {}, "h1")), Reply.text("late")],
        tools=[hanging_tool(started)],
    ) as rt:
        parent, child = await _stuck_pair(rt, started, budget)
        with trio.fail_after(60):
            if path == "run-caller":
                with trio.move_on_after(1):
                    await parent.agent.run("go")
            else:
                parent.agent.followup("go")
                await trio.sleep(1)
                if path == "cancel":
                    parent.agent.cancel()
                elif path == "dispose":
                    await parent.dispose()
            await parent.agent.wait_idle()
            await child.agent.wait_idle()
        parent_log = await stored(rt, parent.session_id) if path != "dispose" else None
        child_events = child.agent.session.events
        assert turn_ends(child_events) == [{"kind": "aborted", "cause": "parent"}]
        result = [e for e in child_events if e.type == "tool/result"]
        assert result[0].data["error"]["code"] == "ABORTED"
        if path == "dispose":
            assert rt.agents.get("child") is None  # disposed with its parent
        else:
            (end,) = turn_ends(parent_log)
            assert end["kind"] == "aborted"
            assert end["cause"] == ("hook" if path == "budget-seconds" else "user")
        sessions = [parent.session_id, child.session_id]
    for session_id in sessions:
        assert_well_formed(await stored(rt, session_id))


async def test_the_cancel_goes_down_the_tree_and_not_up(autojump_clock):
    started = trio.Event()
    async with parent_child_runtime(
        parent=[Reply.hang()],
        child=[Reply.hang(), Reply.tool_calls(("hang", {}, "h1"))],
        tools=[hanging_tool(started)],
    ) as rt:
        parent = await rt.agents.create(options=PARENT)
        child = await rt.agents.create(options=CHILD, parent_agent=parent.agent)
        grandchild = await rt.agents.create(
            options=AgentOptions(id="grandchild", provider="c", model="m"),
            parent_agent=child.agent,
        )
        parent.agent.followup("go")
        child.agent.followup("go")
        grandchild.agent.followup("go")
        await started.wait()
        grandchild.agent.cancel()  # a child's cancel stays below it
        await grandchild.agent.wait_idle()
        assert parent.agent.status.value == child.agent.status.value == "running"
        grandchild.agent.followup("again")  # no wake was dropped for a child cancel
        child.agent.cancel()
        await child.agent.wait_idle()
        assert parent.agent.status.value == "running"
        parent.agent.cancel()
        await parent.agent.wait_idle()
        assert turn_ends(child.agent.session.events) == [{"kind": "aborted", "cause": "user"}]
        assert turn_ends(parent.agent.session.events) == [{"kind": "aborted", "cause": "user"}]


async def test_an_idle_parent_cancel_leaves_its_children_alone(autojump_clock):
    started = trio.Event()
    async with parent_child_runtime(
        child=[Reply.tool_calls(("hang", {}, "h1"))], tools=[hanging_tool(started)]
    ) as rt:
        parent = await rt.agents.create(options=PARENT)
        child = await rt.agents.create(options=CHILD, parent_agent=parent.agent)
        child.agent.followup("work")
        await started.wait()
        parent.agent.cancel()
        await trio.sleep(1)
        assert child.agent.status.value == "running"
        child.agent.cancel()
        await child.agent.wait_idle()
        assert turn_ends(child.agent.session.events) == [{"kind": "aborted", "cause": "user"}]


# -- dispose order -------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["handle", "runtime-exit"])
async def test_disposing_a_parent_disposes_its_children_first(autojump_clock, how):
    order = []
    async with parent_child_runtime() as rt:
        rt.hooks.on("agent/disposed", lambda e: order.append(e.data["agent_id"]))
        parent = await rt.agents.create(options=PARENT)
        child = await rt.agents.create(options=CHILD, parent_agent=parent.agent)
        await rt.agents.create(
            options=AgentOptions(id="grandchild", provider="c", model="m"),
            parent_agent=child.agent,
        )
        await rt.agents.create(options=AgentOptions(id="other", provider="c", model="m"))
        if how == "handle":
            await parent.dispose()
            assert [a.id for a in rt.agents.list()] == ["other"]
    assert order.index("grandchild") < order.index("child") < order.index("main")


# -- fork ------------------------------------------------------------------------------------------
def _two_turns():
    return [
        Reply.tool_calls(("look", {}, "l1")),
        Reply.text("first"),
        Reply.text("second"),
    ]


@tool
async def look() -> str:
    """Look around."""
    return "a room"


async def _source(rt):
    handle = await rt.agents.create(session_id="src", options=PARENT)
    await handle.agent.run("one")
    await handle.agent.run("two")
    return handle


# SQLite works in threads: no autojump_clock (virtual time would run while a thread works).
async def test_fork_everything_on_sqlite_and_resume_it(tmp_path):
    path = tmp_path / "sessions.db"
    async with parent_child_runtime(
        parent=[*_two_turns(), Reply.text("forked")], store=SqliteStore(path), tools=[look]
    ) as rt:
        source = await _source(rt)
        committed = list(source.agent.session.events)
        fork = await rt.agents.fork("src", options=AgentOptions(id="fork"), new_session_id="fk")
        header = fork.agent.session.header
        assert plain(header["forked_from"]) == {"session_id": "src", "at_seq": len(committed)}
        assert header["agent_id"] == "fork"
        assert plain(header["options"])["provider"] == "p"  # remembered from the source
        events = fork.agent.session.events
        assert events[: len(committed)] == committed
        assert events[len(committed)].type == SESSION_END_SEED
        assert plain(events[len(committed)].data) == {"inherited": True}
        result = await fork.agent.run("three")
        assert result.text == "forked"
        messages = fork.agent.session.derive_messages()
        assert [m["role"] for m in messages].count("user") == 3
        assert len(source.agent.session.events) == len(committed)  # the source is untouched
    async with parent_child_runtime(store=SqliteStore(path)) as rt:
        again = await rt.agents.resume("fk")
        assert again.agent.id == "fork"
        assert plain(again.agent.session.header["forked_from"])["session_id"] == "src"
        assert_well_formed(again.agent.session.events)


@pytest.mark.parametrize("cut", ["tool-call", "turn-boundary"])
async def test_fork_mid_way_is_well_formed(tmp_path, cut):
    async with parent_child_runtime(
        parent=_two_turns(), store=SqliteStore(tmp_path / "s.db"), tools=[look]
    ) as rt:
        source = await _source(rt)
        events = source.agent.session.events
        wanted = "tool/call" if cut == "tool-call" else "turn/end"
        at = next(e.seq for e in events if e.type == wanted) + 1
        fork = await rt.agents.fork("src", at, options=AgentOptions(id="fork"))
        forked = fork.agent.session.events
        assert forked[:at] == events[:at]
        assert forked[at].type == SESSION_END_SEED
        assert plain(fork.agent.session.header["forked_from"]) == {
            "session_id": "src",
            "at_seq": at,
        }
        if cut == "tool-call":  # the open turn is closed after the seed
            assert types(forked[at + 1 :]) == ["tool/result", "step/end", "turn/end"]
            assert forked[at + 1].data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
            assert forked[at + 1].source_event_seqs == (at - 1,)
            assert turn_ends(forked) == [{"kind": "interrupted"}]
        else:
            assert len(forked) == at + 1
        assert_well_formed(forked)
        await fork.agent.flush()
        assert await stored(rt, fork.session_id) == forked


async def test_fork_of_a_running_session_takes_its_committed_events(autojump_clock):
    async with parent_child_runtime(parent=[Reply.hang("partial")]) as rt:
        source = await rt.agents.create(session_id="src", options=PARENT)
        source.agent.followup("go")
        await trio.sleep(1)
        await source.agent.flush()
        fork = await rt.agents.fork("src", options=AgentOptions(id="fork"))
        assert source.agent.status.value == "running"
        assert turn_ends(fork.agent.session.events) == [{"kind": "interrupted"}]
        assert_well_formed(fork.agent.session.events)
        source.agent.cancel()


async def test_fork_refusals(autojump_clock):
    async with parent_child_runtime(parent=[Reply.text("one")]) as rt:
        source = await rt.agents.create(session_id="src", options=PARENT)
        await source.agent.run("one")
        size = len(source.agent.session.events)
        for bad in (0, size + 1, -1, True):
            with pytest.raises(InvalidOptionError, match="at_seq"):
                await rt.agents.fork("src", bad, options=AgentOptions(id="f"))
        with pytest.raises(AgentAlreadyExistsError):
            await rt.agents.fork("src")  # the source's own id, which is live
        assert rt.agents.get("f") is None
        with pytest.raises(SessionNotFoundError):
            await rt.agents.fork("nope", options=AgentOptions(id="f"))


async def test_a_fork_made_for_a_parent_is_its_child(autojump_clock):
    async with parent_child_runtime(parent=[Reply.text("one")]) as rt:
        source = await rt.agents.create(session_id="src", options=PARENT)
        await source.agent.run("one")
        child = await rt.agents.fork("src", options=AgentOptions(id="f"), parent_agent=source.agent)
        assert child.agent.session.header["parent_session_id"] == "src"
        assert source.agent.children == (child.agent,)


async def test_a_fork_runs_the_messages_queued_in_the_inbox_it_inherits(autojump_clock):
    async with parent_child_runtime(
        parent=[Reply.hang("working on a"), Reply.text("b answered")]
    ) as rt:
        source = await rt.agents.create(session_id="src", options=PARENT)
        source.agent.followup("a")
        await trio.sleep(1)  # turn 1 hangs on its model
        source.agent.followup("b")  # queued behind it, unclaimed
        await source.agent.flush()
        fork = await rt.agents.fork("src", options=AgentOptions(id="fork"))
        await fork.agent.wait_idle()
        events = fork.agent.session.events
        assert turn_ends(events) == [{"kind": "interrupted"}, {"kind": "completed"}]
        assert user_texts(fork.agent.session.derive_messages()) == ["a", "b"]
        assert fork.agent.session.derive_messages()[-1]["content"][0]["text"] == "b answered"
        assert len(fork.agent.inbox.next_turn) == 0
        assert_well_formed(events)
        assert turn_ends(source.agent.session.events) == []  # the source is untouched
        source.agent.cancel()
