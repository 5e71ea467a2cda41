"""Tool-execute middleware, flush notifications, and claimed messages kept when a hook fails."""

from __future__ import annotations

from dsh_agent_loop import (
    AgentOptions,
    MemoryStore,
    Reply,
    ScriptedModel,
    ToolResult,
    open_runtime,
    tool,
)

from .conftest import assert_well_formed, of_type, turn_ends, user_texts

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


@tool
async def explode(x: int) -> str:
    """Always fails."""
    raise ValueError(f"bad {x}")


async def test_execute_middleware_sees_a_tool_result_when_the_handler_raises(autojump_clock):
    seen = []

    async def middleware(payload, next):
        result = await next(payload)
        seen.append(result)
        return result

    model = ScriptedModel([Reply.tool_calls(("explode", {"x": 1})), Reply.text("ok")])
    async with open_runtime(
        store=MemoryStore(), providers={"scripted": model}, tools=[explode]
    ) as rt:
        rt.hooks.waterfall("tools/execute", middleware)
        h = await rt.agents.create(options=OPTIONS)
        h.agent.followup("go")
        await h.agent.wait_idle()
        events = h.agent.session.events
    assert len(seen) == 1
    assert isinstance(seen[0], ToolResult)
    assert seen[0].error == "TOOL_ERROR"
    assert seen[0].content == "Error: ValueError: bad 1"
    (result,) = of_type(events, "tool/result")
    assert dict(result.data["error"]) == {"name": "ValueError", "code": "TOOL_ERROR"}
    assert turn_ends(events) == [{"kind": "completed"}]
    assert_well_formed(events)


async def test_session_flush_is_published_after_commits(autojump_clock):
    flushed = []
    model = ScriptedModel([Reply.text("hi")])
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        rt.hooks.on("session/flush", flushed.append)
        h = await rt.agents.create(options=OPTIONS)
        h.agent.followup("go")
        await h.agent.wait_idle()
        last = h.agent.session.events[-1].seq
    assert flushed, "no session/flush notification"
    assert flushed[-1].data["seq"] == last
    assert flushed[-1].data["session_id"] == h.agent.session_id
    assert all(f.seq is None for f in flushed)


async def test_claimed_message_is_kept_when_pre_step_raises(autojump_clock):
    async def broken(payload, next):
        raise RuntimeError("pre-step broke")

    model = ScriptedModel([Reply.text("second turn")])
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        dispose = rt.hooks.waterfall("agent/pre-step", broken)
        h = await rt.agents.create(options=OPTIONS)
        h.agent.followup("what I asked")
        await h.agent.wait_idle()
        dispose()
        h.agent.followup("again")
        await h.agent.wait_idle()
        events = h.agent.session.events
    ends = turn_ends(events)
    assert ends[0]["kind"] == "error"
    assert "pre-step broke" in ends[0]["error"]["message"]
    assert ends[1] == {"kind": "completed"}
    # the failed turn still shows what was asked, and the next request carries it
    assert user_texts(h.agent.session.derive_messages()) == ["what I asked", "again"]
    assert_well_formed(events)
