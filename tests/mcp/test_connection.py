"""MCP servers over stdio: tools listed, called, failing, crashing, changing, and cleaned up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from dsh_agent_loop import open_runtime
from dsh_agent_loop._tools.base import ToolResult
from dsh_agent_loop.mcp import McpServer, McpStartError, open_mcp_servers
from dsh_agent_loop.mcp import _connection as connection
from dsh_agent_loop.mcp._connection import STDERR_TAIL

from .conftest import PROCESS_WAIT, process_gone, stdio_server, wait_for


async def call(rt: object, name: str, **arguments: object) -> ToolResult:
    tool = rt.tools[name]  # type: ignore[attr-defined]
    with trio.fail_after(PROCESS_WAIT):
        result: ToolResult = await tool.handler(arguments, None)
    return result


async def test_tools_are_listed_with_prefix_schema_and_modes(tmp_path: Path) -> None:
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
        assert rt.start_failures == []
        names = sorted(n for n in rt.tools if n.startswith("t__"))
        assert names == [
            "t__big",
            "t__crash",
            "t__echo",
            "t__fail",
            "t__grow",
            "t__picture",
            "t__sleep",
        ]
        echo = rt.tools["t__echo"]
        assert echo.description == "Echo the text back."
        assert echo.parameters["properties"]["text"]["type"] == "string"
        assert echo.parameters["required"] == ("text",)
        assert echo.execution_mode == "parallel"  # readOnlyHint: true
        assert rt.tools["t__fail"].execution_mode == "exclusive"  # no hint: the safe default


async def test_prefix_and_execution_mode_are_configurable(tmp_path: Path) -> None:
    server = stdio_server(tmp_path, prefix="x_", execution_modes={"fail": "parallel"})
    async with open_runtime(mcp_servers=[server]) as rt:
        assert "x_echo" in rt.tools
        assert "t__echo" not in rt.tools
        assert rt.tools["x_fail"].execution_mode == "parallel"


async def test_calls_return_text_and_is_error_is_a_tool_error(tmp_path: Path) -> None:
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
        assert await call(rt, "t__echo", text="hi") == ToolResult("echo: hi")
        failed = await call(rt, "t__fail", message="the disk is full")
        assert failed.error == "TOOL_ERROR"
        assert "the disk is full" in failed.content
        assert rt.mcp is not None
        assert rt.mcp.statistics().calls == 2


async def test_an_image_is_a_text_note_plus_meta(tmp_path: Path) -> None:
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
        result = await call(rt, "t__picture")
        assert result.error is None
        assert result.content == "a red dot\n[image image/png, 12 base64 characters]"
        assert result.meta is not None
        (block,) = result.meta["mcp_content"]
        assert block == {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}


async def test_a_crash_is_a_tool_error_and_the_next_call_restarts_it(tmp_path: Path) -> None:
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
        first_pid = int((tmp_path / "pid").read_text())
        crashed = await call(rt, "t__crash")
        assert crashed.error == "TOOL_ERROR"
        assert "stopped during the call" in crashed.content
        assert await call(rt, "t__echo", text="again") == ToolResult("echo: again")
        assert (tmp_path / "starts").read_text() == "2"
        assert int((tmp_path / "pid").read_text()) != first_pid
        assert process_gone(first_pid)
        assert rt.mcp is not None
        assert rt.mcp.statistics().starts == 2


async def test_crashing_again_without_a_success_backs_off(tmp_path: Path) -> None:
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
        assert (await call(rt, "t__crash")).error == "TOOL_ERROR"
        assert (await call(rt, "t__crash")).error == "TOOL_ERROR"  # restarted, crashed again
        refused = await call(rt, "t__echo", text="x")  # inside the backoff window
        assert refused.error == "TOOL_ERROR"
        assert "not running" in refused.content
        assert (tmp_path / "starts").read_text() == "2"


async def test_a_list_change_refreshes_the_tools(tmp_path: Path) -> None:
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
        assert "t__late" not in rt.tools
        assert await call(rt, "t__grow") == ToolResult("grown")
        with trio.fail_after(PROCESS_WAIT):
            while "t__late" not in rt.tools:
                await trio.sleep(0.01)
        assert await call(rt, "t__late") == ToolResult("late tool")
        assert "t__echo" in rt.tools


async def test_a_server_that_fails_to_start_is_a_start_failure_with_its_stderr(
    tmp_path: Path,
) -> None:
    script = "import sys; sys.stderr.write('x' * 5000 + 'cannot open the database'); sys.exit(2)"
    bad = McpServer.stdio("bad", sys.executable, ["-c", script])
    missing = McpServer.stdio("missing", str(tmp_path / "no-such-program"))
    async with open_runtime(mcp_servers=[bad, stdio_server(tmp_path), missing]) as rt:
        failures = {f.agent_id: f.error for f in rt.start_failures}
        assert sorted(failures) == ["mcpServers.bad", "mcpServers.missing"]
        error = failures["mcpServers.bad"]
        assert isinstance(error, McpStartError)
        assert error.stderr_tail.endswith("cannot open the database")
        assert len(error.stderr_tail) == STDERR_TAIL
        assert "FileNotFoundError" in str(failures["mcpServers.missing"])
        assert not any(n.startswith("bad__") for n in rt.tools)
        assert await call(rt, "t__echo", text="ok") == ToolResult("echo: ok")  # others run


async def test_no_process_is_left_after_the_runtime_closes(tmp_path: Path) -> None:
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]):
        pid = int((tmp_path / "pid").read_text())
        assert not process_gone(pid)
    assert process_gone(pid)


async def test_no_process_is_left_after_the_block_is_cancelled(tmp_path: Path) -> None:
    with trio.CancelScope() as scope:
        async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
            pid = int((tmp_path / "pid").read_text())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rt.tools["t__sleep"].handler, {}, None)
                await wait_for(tmp_path / "started")
                scope.cancel()
    assert scope.cancelled_caught
    assert process_gone(pid)
    assert (tmp_path / "cancelled").exists()


async def test_without_servers_nothing_is_opened() -> None:
    me = trio.lowlevel.current_task()
    before = list(me.child_nurseries)
    async with open_mcp_servers() as mcp:
        assert me.child_nurseries == before
        assert await mcp.start(lambda tool: lambda: None) == []
        assert mcp.statistics().servers == 0
    async with open_runtime() as rt:
        assert rt.mcp is not None
        assert rt.mcp.connections == {}


@pytest.mark.parametrize(
    ("version", "says"),
    [
        (None, "the MCP SDK is not installed (pip install 'dsh-agent-loop[mcp]')"),
        ("1.26.0", "mcp 1.26.0 is installed, and MCP servers need mcp>=2"),
    ],
)
async def test_a_missing_or_old_sdk_is_a_start_failure_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str | None, says: str
) -> None:
    monkeypatch.setattr(connection, "_sdk_version", lambda: version)
    async with open_runtime(mcp_servers=[stdio_server(tmp_path)]) as rt:
        (failure,) = rt.start_failures
        assert failure.agent_id == "mcpServers.t"
        assert isinstance(failure.error, McpStartError)
        assert says in str(failure.error)
        assert not any(n.startswith("t__") for n in rt.tools)
    assert not (tmp_path / "pid").exists()  # no process was started
