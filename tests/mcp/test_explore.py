"""``explore_cancellation`` over a turn that calls MCP tools (an in-process server)."""

from __future__ import annotations

from typing import Any

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel
from dsh_agent_loop.mcp import McpServer, open_mcp_servers
from dsh_agent_loop.testing import explore_cancellation

from . import server as test_server


async def mcp_turn(rt: Any) -> None:
    spec = McpServer.in_process("t", test_server.server)
    async with open_mcp_servers([spec]) as mcp:
        assert await mcp.start(rt.add_tool) == []
        options = AgentOptions(id="main", provider="scripted", model="m")
        handle = await rt.agents.create(options=options)
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        await handle.dispose()  # before the server goes: a cancelled call may still be closing


def mcp_model() -> dict[str, ScriptedModel]:
    calls = (("t__echo", {"text": "a"}), ("t__fail", {"message": "b"}))
    return {"scripted": ScriptedModel([Reply.tool_calls(*calls), Reply.text("done")])}


def test_every_checkpoint_of_an_mcp_turn_is_well_formed() -> None:
    report = explore_cancellation(mcp_turn, providers=mcp_model, seed=1)
    assert report.failures == []
    assert report.checkpoints >= 12  # memory store: flushes commit inline, no writer wake-up
    assert report.runs == report.checkpoints
    assert report.sites >= 2
