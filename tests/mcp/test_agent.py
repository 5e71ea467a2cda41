"""A turn calling MCP tools: results in the log; a cancel mid-call reaches the server."""

from __future__ import annotations

from pathlib import Path

import trio

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, open_runtime

from ..agent.conftest import assert_well_formed, plain, turn_ends
from .conftest import PROCESS_WAIT, process_gone, stdio_server, wait_for

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


def results(events: object) -> list[dict[str, object]]:
    return [plain(e.data) for e in events if e.type == "tool/result"]  # type: ignore[attr-defined]


async def test_a_turn_calls_an_mcp_tool(tmp_path: Path) -> None:
    model = ScriptedModel(
        [Reply.tool_calls(("t__echo", {"text": "hello"}, "c1")), Reply.text("done")]
    )
    async with open_runtime(
        providers={"scripted": model}, mcp_servers=[stdio_server(tmp_path)]
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        with trio.fail_after(PROCESS_WAIT):
            result = await handle.agent.run("say hello")
        assert result.text == "done"
        (record,) = result.tool_calls
        assert record.name == "t__echo"
        events = handle.agent.session.events
        (data,) = results(events)
        assert "echo: hello" in str(data)
        assert_well_formed(events)
        # the model saw the MCP tool's schema
        (first, _) = model.requests
        assert "t__echo" in [t["name"] for t in first.tools]


async def test_cancelling_the_turn_cancels_the_call_on_the_server(tmp_path: Path) -> None:
    model = ScriptedModel([Reply.tool_calls(("t__sleep", {}, "c1")), Reply.text("never")])
    async with open_runtime(
        providers={"scripted": model}, mcp_servers=[stdio_server(tmp_path)]
    ) as rt:
        pid = int((tmp_path / "pid").read_text())
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("sleep")
        await wait_for(tmp_path / "started")
        handle.agent.cancel()
        with trio.fail_after(PROCESS_WAIT):
            await handle.agent.wait_idle()
        # the server saw notifications/cancelled: its handler was cancelled, the process lives
        await wait_for(tmp_path / "cancelled")
        assert not process_gone(pid)
        events = handle.agent.session.events
        assert turn_ends(events) == [{"kind": "aborted", "cause": "user"}]
        (data,) = results(events)
        assert data["error"]["code"] == "ABORTED"  # type: ignore[index]
        assert_well_formed(events)
        assert len(model.requests) == 1
    assert process_gone(pid)


async def test_a_list_change_starts_a_new_request_series(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            Reply.tool_calls(("t__grow", {}, "c1")),
            Reply.text("grown"),
            Reply.tool_calls(("t__late", {}, "c2")),
            Reply.text("done"),
        ]
    )
    async with open_runtime(
        providers={"scripted": model}, mcp_servers=[stdio_server(tmp_path)]
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        with trio.fail_after(PROCESS_WAIT):
            await handle.agent.run("grow")
            while "t__late" not in rt.tools:  # the refresh follows the notification
                await trio.sleep(0.01)
            await handle.agent.run("use the new tool")
        events = handle.agent.session.events
        assert_well_formed(events)
        assert [r["message"]["content"][0]["text"] for r in results(events)] == [  # type: ignore[index]
            "grown",
            "late tool",
        ]
    offered = [[t["name"] for t in request.tools] for request in model.requests]
    assert "t__late" not in offered[0]
    assert "t__late" in offered[-1]
    headers = [plain(e.data) for e in events if e.type == "request/header"]
    first, *changed = headers
    assert first["reason"] == "initial"
    # Exactly one new series: the first request that offered the new tool started it.
    (change,) = changed
    assert change["reason"] == "change"
    assert change["starts_series"] is True
    assert "t__late" in [t["name"] for t in change["header"]["tools"]]
