"""An MCP server over streamable HTTP on loopback: listing, calls, errors, concurrency, cancel."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from dsh_agent_loop import Limits, open_runtime
from dsh_agent_loop._tools.base import ToolResult
from dsh_agent_loop.mcp import McpServer

from .conftest import PROCESS_WAIT, serve_http, wait_for

# The SDK's HTTP transport leaves httpx2's response and SSE iterators to the garbage collector
# when a stream is cut short (its shutdown cancels them); trio's finalizer warns about each.
pytestmark = [
    pytest.mark.filterwarnings(
        r"ignore:Async generator '(httpx2|httpcore2)\.:ResourceWarning",
    ),
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <async_generator object "
        r"(Response|EventSource|PoolByteStream)\.:pytest.PytestUnraisableExceptionWarning",
    ),
]


async def test_tools_over_http(http_server: tuple[str, Path]) -> None:
    url, _ = http_server
    server = McpServer.http("web", url, headers={"X-Test": "1"})
    async with open_runtime(mcp_servers=[server]) as rt:
        assert rt.start_failures == []
        assert rt.tools["web__echo"].execution_mode == "parallel"
        with trio.fail_after(PROCESS_WAIT):
            assert await rt.tools["web__echo"].handler({"text": "a"}, None) == ToolResult("echo: a")
            failed = await rt.tools["web__fail"].handler({"message": "nope"}, None)
        assert failed.error == "TOOL_ERROR"
        assert "nope" in failed.content


async def test_concurrent_http_calls_each_get_their_own_answer(
    http_server: tuple[str, Path],
) -> None:
    url, _ = http_server
    answers: dict[int, ToolResult] = {}
    async with open_runtime(mcp_servers=[McpServer.http("web", url)]) as rt:
        echo = rt.tools["web__echo"]

        async def one(i: int) -> None:
            answers[i] = await echo.handler({"text": str(i)}, None)

        with trio.fail_after(PROCESS_WAIT):
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
    assert answers == {i: ToolResult(f"echo: {i}") for i in range(20)}


async def test_a_cancelled_http_call_is_cancelled_on_the_server(
    http_server: tuple[str, Path],
) -> None:
    url, markers = http_server
    async with open_runtime(mcp_servers=[McpServer.http("web", url)]) as rt:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rt.tools["web__sleep"].handler, {}, None)
                await wait_for(markers / "started")
                scope.cancel()
        await wait_for(markers / "cancelled")
        with trio.fail_after(PROCESS_WAIT):
            assert await rt.tools["web__echo"].handler({"text": "b"}, None) == ToolResult("echo: b")


async def test_an_unreachable_http_server_is_a_start_failure(tmp_path: Path) -> None:
    from .conftest import free_port

    server = McpServer.http("gone", f"http://127.0.0.1:{free_port()}/mcp")
    async with open_runtime(mcp_servers=[server]) as rt:
        ((failure),) = rt.start_failures
        assert failure.agent_id == "mcpServers.gone"
        assert "did not start" in str(failure.error)


@pytest.mark.parametrize("mode", ["http", "http-json"])
async def test_an_http_message_over_the_limit_is_a_tool_error(tmp_path: Path, mode: str) -> None:
    limits = Limits(mcp_max_message_bytes=100_000)
    async with (
        serve_http(tmp_path, mode) as url,
        open_runtime(mcp_servers=[McpServer.http("web", url)], limits=limits) as rt,
    ):
        with trio.fail_after(PROCESS_WAIT):
            result = await rt.tools["web__big"].handler({"size": 3_000_000}, None)
            assert result.error == "TOOL_ERROR"
            assert "over the 100,000-byte limit" in result.content
            assert "(limits.mcpMaxMessageBytes)" in result.content
            answer = await rt.tools["web__big"].handler({"size": 10}, None)
        assert answer == ToolResult("x" * 10)
