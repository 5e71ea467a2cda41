"""``tool_result``: MCP content blocks as the text the model reads, the rest in ``meta``."""

from __future__ import annotations

from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from dsh_agent_loop._tools.base import ToolResult
from dsh_agent_loop.mcp import tool_result


def test_text_blocks_are_joined() -> None:
    result = CallToolResult(
        content=[TextContent(type="text", text="a"), TextContent(type="text", text="b")]
    )
    assert tool_result(result) == ToolResult("a\nb")


def test_resources_are_notes_and_kept_in_meta() -> None:
    resource = TextResourceContents(uri="file:///a.txt", mime_type="text/plain", text="hello")
    link = ResourceLink(type="resource_link", name="b", uri="file:///b.txt")
    result = CallToolResult(content=[EmbeddedResource(type="resource", resource=resource), link])
    converted = tool_result(result)
    assert converted.content == (
        "[resource file:///a.txt (text/plain)]\n[resource link file:///b.txt (b)]"
    )
    assert converted.meta is not None
    embedded, linked = converted.meta["mcp_content"]
    assert embedded["resource"]["text"] == "hello"
    assert linked["uri"] == "file:///b.txt"


def test_structured_content_alone_is_its_json() -> None:
    result = CallToolResult(content=[], structured_content={"temperature": 21})
    assert tool_result(result) == ToolResult('{"temperature": 21}')


def test_is_error_is_a_tool_error_with_the_server_text() -> None:
    result = CallToolResult(content=[TextContent(type="text", text="no such city")], is_error=True)
    assert tool_result(result) == ToolResult("no such city", error="TOOL_ERROR")
    empty = CallToolResult(content=[], is_error=True)
    assert tool_result(empty).error == "TOOL_ERROR"
