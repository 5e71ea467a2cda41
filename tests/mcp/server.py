"""A real MCP server for the tests, written with the SDK's own server API.

Run as ``python server.py stdio`` or ``python server.py http|http-json PORT``, or import
``server`` and run it in process (``McpServer.in_process``). Its tools are async functions: the
SDK runs a sync tool in a worker thread, which a ``MockClock`` would leap over. ``MARKER_DIR`` (an
environment variable) is where the ``sleep`` tool writes ``cancelled`` when its handler is
cancelled, and where ``crash`` counts the process starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent, ToolAnnotations

server = MCPServer("test-server", log_level="WARNING")
MARKERS = Path(os.environ.get("MARKER_DIR", "."))


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@server.tool()
async def fail(message: str) -> str:
    """Always fail with the message."""
    raise ToolError(message)


@server.tool()
async def sleep() -> str:
    """Sleep until cancelled; the cancellation leaves a marker file."""
    (MARKERS / "started").write_text("started")
    try:
        await anyio.sleep_forever()
    finally:
        (MARKERS / "cancelled").write_text("cancelled")
    return "never"


@server.tool()
def crash() -> str:
    """Exit the process at once, in the middle of the call."""
    os._exit(3)


@server.tool()
async def picture() -> list[ImageContent | TextContent]:
    """Return a caption and an image."""
    return [
        TextContent(type="text", text="a red dot"),
        ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
    ]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def big(size: int) -> str:
    """Answer with ``size`` characters."""
    return "x" * size


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the ``late`` tool and tell the client the list changed."""

    def late() -> str:
        """A tool added while the server runs."""
        return "late tool"

    server.add_tool(late, name="late")
    await ctx.session.send_tool_list_changed()
    return "grown"


def main() -> None:
    """Serve on stdio, or streamable HTTP on 127.0.0.1:PORT."""
    starts = MARKERS / "starts"
    count = int(starts.read_text()) if starts.exists() else 0
    starts.write_text(str(count + 1))
    (MARKERS / "pid").write_text(str(os.getpid()))
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:  # "http" answers with SSE streams, "http-json" with JSON bodies
        json_response = sys.argv[1] == "http-json"
        port = int(sys.argv[2])
        server.run("streamable-http", host="127.0.0.1", port=port, json_response=json_response)


if __name__ == "__main__":
    main()
