"""Hostile MCP servers (real SDK servers on stdio): schemas, names, counts, sizes, silence."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import AgentOptions, Limits, Reply, ScriptedModel, open_runtime
from dsh_agent_loop._tools.base import ToolResult, tool
from dsh_agent_loop.mcp import McpServer, McpStartError

from ..agent.conftest import plain
from . import server as test_server
from .conftest import PROCESS_WAIT, wait_for

HOSTILE = str(Path(__file__).with_name("hostile_server.py"))
OPTIONS = AgentOptions(id="main", provider="scripted", model="m")
OBJECT: dict[str, Any] = {"type": "object"}


def hostile(tools: list[dict[str, Any]], name: str = "h", **env: str) -> McpServer:
    """The hostile server on stdio, listing ``tools`` as given."""
    variables = {"HOSTILE_TOOLS": json.dumps(tools), **env}
    return McpServer.stdio(name, sys.executable, [HOSTILE], env=variables, prefix=f"{name}__")


def echo(name: str = "echo", schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "inputSchema": schema or OBJECT, "behavior": "echo"}


async def call(rt: Any, name: str, **arguments: Any) -> ToolResult:
    with trio.fail_after(PROCESS_WAIT):
        result: ToolResult = await rt.tools[name].handler(arguments, None)
    return result


def failure_of(rt: Any, server: str) -> str:
    failures = {f.agent_id: f.error for f in rt.start_failures}
    error = failures[f"mcpServers.{server}"]
    assert isinstance(error, McpStartError)
    return str(error)


def tool_results(events: Any) -> list[dict[str, Any]]:
    return [plain(e.data) for e in events if e.type == "tool/result"]


@contextlib.contextmanager
def hang_guard(seconds: float) -> Iterator[None]:
    """Fail (not hang) when synchronous code holds the thread longer than ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the event loop was held for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def test_a_remote_ref_skips_the_tool_and_nothing_is_fetched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
        remote = {"type": "object", "properties": {"x": {"$ref": url}}}
        relative = {"$id": url, "type": "object", "properties": {"x": {"$ref": "other.json"}}}
        tools = [echo(), echo("remote", remote), echo("relative", relative)]
        model = ScriptedModel(
            [
                Reply.tool_calls(("h__remote", {"x": 1}, "c1"), ("h__echo", {"y": 2}, "c2")),
                Reply.text("done"),
            ]
        )
        with caplog.at_level(logging.WARNING, logger="dsh_agent_loop.mcp"):
            async with open_runtime(
                providers={"scripted": model}, mcp_servers=[hostile(tools)]
            ) as rt:
                assert rt.start_failures == []
                assert sorted(n for n in rt.tools if n.startswith("h__")) == ["h__echo"]
                assert rt.mcp is not None
                skipped = rt.mcp.connections["h"].skipped
                assert "is not a local reference" in skipped["remote"]
                assert "'other.json' is not a local reference" in skipped["relative"]
                handle = await rt.agents.create(options=OPTIONS)
                with trio.fail_after(PROCESS_WAIT):
                    await handle.agent.run("go")
                first, second = tool_results(handle.agent.session.events)
                assert first["error"]["code"] == "UNKNOWN_TOOL"
                assert second["message"]["content"][0]["text"] == '{"y": 2}'
        with pytest.raises(BlockingIOError):
            listener.accept()  # the listener never saw a connection
    warnings = [r.getMessage() for r in caplog.records]
    assert any("'h'" in w and "'remote'" in w and "not a local reference" in w for w in warnings)


async def test_a_backtracking_pattern_is_rejected_while_other_tasks_run(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a+)+$"}}}
    argument = "a" * 64 + "!"  # days for a backtracking engine
    model = ScriptedModel([Reply.tool_calls(("h__match", {"x": argument}, "c1")), Reply.text("ok")])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    async with open_runtime(
        providers={"scripted": model}, mcp_servers=[hostile([echo("match", schema)])]
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            before = ticks
            with hang_guard(PROCESS_WAIT), trio.fail_after(PROCESS_WAIT):
                await handle.agent.run("match")
            assert ticks > before  # the loop went on while the turn ran
            nursery.cancel_scope.cancel()
        (result,) = tool_results(handle.agent.session.events)
        assert result["error"]["code"] == "INVALID_ARGUMENTS"
        text = result["message"]["content"][0]["text"]
        assert "does not match '(a+)+$'" in text
        # A matching argument still reaches the server.
        assert await call(rt, "h__match", x="aaa") == ToolResult('{"x": "aaa"}')


async def test_a_call_the_server_never_answers_is_a_timeout(tmp_path: Path) -> None:
    limits = Limits(mcp_call_timeout=3)
    server = hostile([echo(), {"name": "hang", "inputSchema": OBJECT, "behavior": "hang"}])
    server = McpServer.stdio(
        "h", server.command, server.args, env={**server.env, "MARKER_DIR": str(tmp_path)}
    )
    async with open_runtime(mcp_servers=[server], limits=limits) as rt:
        result = await call(rt, "h__hang")
        assert result.error == "TIMEOUT"
        assert "'hang' did not answer within 3 s (limits.mcpCallTimeout)" in result.content
        await wait_for(tmp_path / "cancelled")  # the server was told
        assert await call(rt, "h__echo", a=1) == ToolResult('{"a": 1}')
        assert rt.mcp is not None
        assert rt.mcp.statistics().starts == 1  # the same connection


async def test_a_timeout_is_the_limit_exactly_and_the_connection_stays(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(test_server, "MARKERS", tmp_path)
    spec = McpServer.in_process("t", test_server.server)
    async with open_runtime(mcp_servers=[spec]) as rt:
        start = trio.current_time()
        with trio.fail_after(120):  # virtual seconds
            result = await rt.tools["t__sleep"].handler({}, None)
        assert trio.current_time() - start == pytest.approx(60.0)  # Limits().mcp_call_timeout
        assert result.error == "TIMEOUT"
        await wait_for(tmp_path / "cancelled")  # the server was told
        assert await rt.tools["t__echo"].handler({"text": "x"}, None) == ToolResult("echo: x")


async def test_tools_with_bad_names_are_skipped_and_the_others_offered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = ["bad name", "new\nline", "x" * 65, "ünï", "", "semi;colon"]
    long_ok = "y" * 62  # fits alone; with the prefix "h__" it is 65 characters
    tools = [echo(n) for n in [*bad, long_ok, "a.b", "ok-1"]]
    with caplog.at_level(logging.WARNING, logger="dsh_agent_loop.mcp"):
        async with open_runtime(mcp_servers=[hostile(tools)]) as rt:
            assert rt.start_failures == []
            assert sorted(n for n in rt.tools if n.startswith("h__")) == ["h__a_b", "h__ok-1"]
            assert rt.mcp is not None
            skipped = rt.mcp.connections["h"].skipped
            assert sorted(skipped) == sorted([*bad, long_ok])
            assert "not 1 to 64 letters, digits" in skipped["new\nline"]
            assert "longer than 64 characters" in skipped[long_ok]
            assert rt.mcp.statistics().skipped == len(bad) + 1
            # the dotted name is called by the server's own name
            assert await call(rt, "h__a_b", q=1) == ToolResult('{"q": 1}')
    assert sum("skipped" in r.getMessage() for r in caplog.records) == len(bad) + 1


async def test_more_tools_than_the_limit_is_a_start_failure() -> None:
    tools = [echo(f"t{i}") for i in range(4)]
    async with open_runtime(mcp_servers=[hostile(tools)], limits=Limits(mcp_max_tools=3)) as rt:
        message = failure_of(rt, "h")
        assert "it lists 4 tools, more than the limit of 3 (limits.mcpMaxTools)" in message
        assert not any(n.startswith("h__") for n in rt.tools)


async def test_a_name_taken_by_a_builtin_or_user_tool_is_a_start_failure() -> None:
    @tool(name="u__echo")
    async def user_echo(text: str) -> str:
        """The user's own echo."""
        return text

    builtin = McpServer.stdio(
        "b",
        sys.executable,
        [HOSTILE],
        env={"HOSTILE_TOOLS": json.dumps([echo("read_file")])},
        prefix="",
    )
    user = hostile([echo("other"), echo("echo")], name="u")
    async with open_runtime(tools=[user_echo], mcp_servers=[builtin, user]) as rt:
        assert "its tool 'read_file' has the same name as the built-in tool 'read_file'" in (
            failure_of(rt, "b")
        )
        assert "its tool 'echo' ('u__echo' here) has the same name as the runtime tool" in (
            failure_of(rt, "u")
        )
        assert rt.tools["u__echo"] is user_echo  # never replaced
        assert "u__other" not in rt.tools  # a failed server offers nothing
        assert "read_file" not in rt.tools


async def test_two_servers_with_one_tool_name_the_later_fails() -> None:
    first = hostile([echo("same"), echo("a")], name="one")
    second = hostile([echo("same"), echo("b")], name="two")
    first = McpServer.stdio("one", first.command, first.args, env=first.env, prefix="x_")
    second = McpServer.stdio("two", second.command, second.args, env=second.env, prefix="x_")
    async with open_runtime(mcp_servers=[first, second]) as rt:
        assert [f.agent_id for f in rt.start_failures] == ["mcpServers.two"]
        assert "has the same name as the tool 'x_same' of MCP server 'one'" in failure_of(rt, "two")
        assert sorted(n for n in rt.tools if n.startswith("x_")) == ["x_a", "x_same"]
        assert await call(rt, "x_same", n=1) == ToolResult('{"n": 1}')


async def test_an_invalid_schema_skips_its_tool_and_the_others_work() -> None:
    tools = [
        echo("typo", {"type": "object", "properties": {"n": {"type": "nope"}}}),
        echo("lookahead", {"type": "object", "properties": {"x": {"pattern": "^(?!-)"}}}),
        echo("good", {"type": "object", "properties": {"n": {"type": "integer"}}}),
    ]
    model = ScriptedModel(
        [
            Reply.tool_calls(("h__good", {"n": "one"}, "c1"), ("h__good", {"n": 1}, "c2")),
            Reply.text("done"),
        ]
    )
    async with open_runtime(providers={"scripted": model}, mcp_servers=[hostile(tools)]) as rt:
        assert rt.start_failures == []
        assert rt.mcp is not None
        skipped = rt.mcp.connections["h"].skipped
        assert sorted(skipped) == ["lookahead", "typo"]
        assert "/properties/n/type: 'nope' is not valid" in skipped["typo"]
        assert "linear-time engine (RE2)" in skipped["lookahead"]
        handle = await rt.agents.create(options=OPTIONS)
        with trio.fail_after(PROCESS_WAIT):
            await handle.agent.run("go")
        refused, answered = tool_results(handle.agent.session.events)
        assert refused["error"]["code"] == "INVALID_ARGUMENTS"
        assert "n: 'one' is not of type 'integer'" in refused["message"]["content"][0]["text"]
        assert answered["message"]["content"][0]["text"] == '{"n": 1}'


class Mute:
    """A server that reads every message and answers none (not even ``initialize``)."""

    def create_initialization_options(self) -> None:
        return None

    async def run(self, read: Any, write: Any, options: None) -> None:
        async with read, write:
            async for _ in read:
                pass


async def test_a_server_that_never_answers_initialize_says_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_runtime(mcp_servers=[McpServer.in_process("mute", Mute())]) as rt:
        start = trio.current_time()
        message = failure_of(rt, "mute")
    assert "did not finish the MCP handshake (no answer to initialize) within 30 s" in message
    assert "TooSlowError" not in message
    assert start == pytest.approx(30.0)


async def test_a_message_over_the_limit_is_a_tool_error_and_the_connection_goes_on() -> None:
    tools = [echo(), {"name": "big", "inputSchema": OBJECT, "behavior": "big"}]
    limits = Limits(mcp_max_message_bytes=100_000)
    server = hostile(tools, BIG_BYTES=str(4_000_000))
    async with open_runtime(mcp_servers=[server], limits=limits) as rt:
        result = await call(rt, "h__big")
        assert result.error == "TOOL_ERROR"
        assert "over the 100,000-byte limit for one MCP message" in result.content
        assert "(limits.mcpMaxMessageBytes)" in result.content
        assert await call(rt, "h__echo", a=1) == ToolResult('{"a": 1}')
        assert rt.mcp is not None
        assert rt.mcp.statistics().starts == 1  # no restart: the stream stayed in step


async def test_a_message_without_an_id_over_the_limit_restarts_the_server(tmp_path: Path) -> None:
    raw = str(Path(__file__).with_name("raw_server.py"))
    server = McpServer.stdio("r", sys.executable, [raw], env={"MARKER_DIR": str(tmp_path)})
    async with open_runtime(
        mcp_servers=[server], limits=Limits(mcp_max_message_bytes=50_000)
    ) as rt:
        assert rt.start_failures == []
        result = await call(rt, "r__shout", size=2_000_000)
        assert result.error == "TOOL_ERROR"
        assert "the connection was closed: the server's message was 2,000,013 bytes" in (
            result.content
        )
        assert "over the 50,000-byte limit" in result.content
        assert await call(rt, "r__shout", size=10) == ToolResult("shouted")
        assert (tmp_path / "starts").read_text() == "2"  # the next call started it again
