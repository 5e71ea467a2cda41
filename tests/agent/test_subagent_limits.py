"""Sub-agent bounds (``_agent/subagents.py``): delegation depth and live sub-agents per runtime.

A model that delegates to itself, or asks for many children at once, must end with a bounded
number of agents; past a bound the ``delegate`` call is a ``LIMIT_EXCEEDED`` result the model
reads, and ``rt.agents.create``/``fork``/``resume`` with a parent raise ``LimitExceededError``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    LimitExceededError,
    Limits,
    MemoryStore,
    Reply,
    ScriptedModel,
    delegate_tool,
    open_runtime,
)
from dsh_agent_loop.llm._base import ModelRequest

from .conftest import assert_well_formed, parent_child_runtime, plain

MAIN = AgentOptions(id="main", provider="s", model="m")
SELF = AgentOptions(id="self", provider="s", model="m")
PARENT = AgentOptions(id="main", provider="p", model="m")


def _text(message: Any) -> str:
    return "".join(block.get("text", "") for block in message["content"])


def self_delegating(request: ModelRequest) -> Reply:
    """Delegate the task to a sub-agent like me; once a result is back, pass it on."""
    last = request.messages[-1]
    if last["role"] == "tool":
        return Reply.text(f"my sub-agent said: {_text(last)}")
    return Reply.tool_calls(("delegate", {"task": "do it, delegating to a sub-agent"}))


def delegate_results(events: Any) -> list[dict[str, Any]]:
    """Each ``tool/result`` of a ``delegate`` call: its text and error code."""
    return [
        {
            "text": _text(e.data["message"]),
            "code": (e.data.get("error") or {}).get("code"),
            "meta": plain(e.data.get("meta")),
        }
        for e in events
        if e.type == "tool/result" and e.data["message"]["name"] == "delegate"
    ]


async def test_a_self_delegating_sub_agent_stops_at_the_depth_limit(autojump_clock):
    store = MemoryStore()
    model = ScriptedModel([self_delegating], loop=True, record=False)
    async with open_runtime(providers={"s": model}, store=store, clock=trio.current_time) as rt:
        rt.add_tool(delegate_tool(rt, SELF))
        main = await rt.agents.create(options=MAIN)
        result = await main.agent.run("go")

        agents = rt.agents.list()
        ids = ["main" + ".self" * depth for depth in range(9)]
        assert [a.id for a in agents] == ids  # the top agent and exactly 8 levels below it
        deepest = agents[-1]
        (refused,) = delegate_results(deepest.session.events)
        assert refused["code"] == "LIMIT_EXCEEDED"
        assert "delegation depth limit 8 reached" in refused["text"]
        assert refused["meta"] == {"child_id": ids[-1] + ".self", "code": "LIMIT_EXCEEDED"}
        for agent in agents[:-1]:  # every other level got its child's answer
            (answered,) = delegate_results(agent.session.events)
            assert answered["code"] is None
            assert "delegation depth limit 8 reached" in answered["text"]
        assert "delegation depth limit 8 reached" in result.text
        for agent in agents:
            await agent.flush()
            assert_well_formed(agent.session.events)
        # the refused ninth level left no session behind
        assert len(await store.list()) == 9


async def test_a_lower_depth_limit_is_the_one_reached(autojump_clock):
    model = ScriptedModel([self_delegating], loop=True, record=False)
    async with open_runtime(
        providers={"s": model}, clock=trio.current_time, limits=Limits(max_delegation_depth=2)
    ) as rt:
        rt.add_tool(delegate_tool(rt, SELF))
        main = await rt.agents.create(options=MAIN)
        result = await main.agent.run("go")
        assert [a.id for a in rt.agents.list()] == ["main", "main.self", "main.self.self"]
        assert "delegation depth limit 2 reached" in result.text


async def test_parallel_delegations_past_the_live_limit_are_refused(autojump_clock):
    calls = [("delegate", {"task": f"task {i}", "child": f"c{i}"}, f"d{i}") for i in range(5)]
    async with parent_child_runtime(
        parent=[Reply.tool_calls(*calls), Reply.text("done")],
        child=[Reply.text("ok")] * 5,
        limits=Limits(max_subagents=3),
    ) as rt:
        rt.add_tool(delegate_tool(rt, AgentOptions(id="helper", provider="c", model="m")))
        parent = await rt.agents.create(options=PARENT)
        await parent.agent.run("go")

        results = delegate_results(parent.agent.session.events)
        assert len(results) == 5
        answered = [r for r in results if r["code"] is None]
        refused = [r for r in results if r["code"] == "LIMIT_EXCEEDED"]
        assert len(answered) == 3
        assert all(r["text"] == "ok" for r in answered)
        assert len(refused) == 2
        assert all("live sub-agents limit 3 reached" in r["text"] for r in refused)
        children = parent.agent.children
        assert len(children) == 3
        assert {r["meta"]["child_id"] for r in answered} == {c.id for c in children}
        assert_well_formed(parent.agent.session.events)
        for child in children:
            assert_well_formed(child.session.events)


async def test_create_and_fork_with_a_parent_raise_past_the_live_limit(autojump_clock):
    async with parent_child_runtime(
        parent=[Reply.text("one")], limits=Limits(max_subagents=2)
    ) as rt:
        parent = await rt.agents.create(session_id="src", options=PARENT)
        await parent.agent.run("one")
        first = await rt.agents.create(
            options=AgentOptions(id="a", provider="c", model="m"), parent_agent=parent.agent
        )
        await rt.agents.fork("src", options=AgentOptions(id="b"), parent_agent=parent.agent)
        with pytest.raises(LimitExceededError, match="live sub-agents limit 2") as raised:
            await rt.agents.create(
                options=AgentOptions(id="c", provider="c", model="m"), parent_agent=parent.agent
            )
        assert raised.value.code == "LIMIT_EXCEEDED"
        with pytest.raises(LimitExceededError):
            await rt.agents.fork("src", options=AgentOptions(id="d"), parent_agent=parent.agent)
        with pytest.raises(LimitExceededError):  # a view's default parent counts the same
            await rt.agents.with_initiator(parent.agent).create(
                options=AgentOptions(id="e", provider="c", model="m")
            )
        assert [a.id for a in rt.agents.list()] == ["main", "a", "b"]
        assert rt.agents.get("c") is None
        # a top-level agent is no sub-agent: the bound does not apply to it
        await rt.agents.create(options=AgentOptions(id="top", provider="c", model="m"))
        # a disposed sub-agent gives its place back
        handle = rt.agents.handle(first.agent.id)
        assert handle is not None
        await handle.dispose()
        again = await rt.agents.create(
            options=AgentOptions(id="c", provider="c", model="m"), parent_agent=parent.agent
        )
        assert again.agent.parent is parent.agent


async def test_a_failed_creation_gives_its_place_back(autojump_clock):
    async with parent_child_runtime(limits=Limits(max_subagents=1)) as rt:
        parent = await rt.agents.create(options=PARENT)

        async def failing_setup(scope: Any, agent: Any) -> None:
            await trio.lowlevel.checkpoint()
            raise RuntimeError("setup failed")

        for _ in range(3):
            with pytest.raises(RuntimeError, match="setup failed"):
                await rt.agents.create(
                    options=AgentOptions(id="c", provider="c", model="m"),
                    parent_agent=parent.agent,
                    setup=failing_setup,
                )
        child = await rt.agents.create(
            options=AgentOptions(id="c", provider="c", model="m"), parent_agent=parent.agent
        )
        assert parent.agent.children == (child.agent,)
        with pytest.raises(LimitExceededError):  # and that one place is now taken
            await rt.agents.create(
                options=AgentOptions(id="d", provider="c", model="m"), parent_agent=parent.agent
            )


async def test_the_depth_limit_holds_for_create_and_resume(autojump_clock):
    store = MemoryStore()
    async with parent_child_runtime(store=store) as rt:  # made under the default limits
        top = await rt.agents.create(session_id="top", options=PARENT)
        child = await rt.agents.create(
            session_id="child",
            options=AgentOptions(id="c", provider="c", model="m"),
            parent_agent=top.agent,
        )
        await rt.agents.create(
            session_id="grand",
            options=AgentOptions(id="g", provider="c", model="m"),
            parent_agent=child.agent,
        )
    async with parent_child_runtime(store=store, limits=Limits(max_delegation_depth=1)) as rt:
        top = await rt.agents.resume("top")
        child = await rt.agents.resume("child")
        assert child.agent.parent is top.agent
        with pytest.raises(LimitExceededError, match="delegation depth limit 1 reached"):
            await rt.agents.resume("grand")  # relinked to its live parent, it would be at 2
        with pytest.raises(LimitExceededError, match="delegation depth limit 1 reached"):
            await rt.agents.create(
                options=AgentOptions(id="g2", provider="c", model="m"), parent_agent=child.agent
            )
        assert [a.id for a in rt.agents.list()] == ["main", "c"]
        assert child.agent.children == ()
        # a refused resume leaves the session unowned: without its live parent it resumes
        await child.dispose()
        grand = await rt.agents.resume("grand")
        assert grand.agent.parent is None
