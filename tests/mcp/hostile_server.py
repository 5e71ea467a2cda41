"""A hostile MCP server for the tests, written with the SDK's low-level server API.

Run as ``python hostile_server.py`` (stdio). ``HOSTILE_TOOLS`` (an environment variable) is a
JSON list of the tools it lists: ``{"name", "inputSchema", "behavior"}``, sent as given (any
name, any schema). Calling a tool does what its ``behavior`` says: ``echo`` answers with the
arguments as JSON, ``hang`` never answers (until cancelled), ``big`` answers with a text of
``BIG_BYTES`` bytes. ``MARKER_DIR`` gets ``cancelled`` when a ``hang`` call is cancelled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

TOOLS: list[dict[str, Any]] = json.loads(os.environ.get("HOSTILE_TOOLS", "[]"))
MARKERS = Path(os.environ.get("MARKER_DIR", "."))


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[types.Tool(name=t["name"], input_schema=t["inputSchema"]) for t in TOOLS]
    )


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    behavior = next((t.get("behavior", "echo") for t in TOOLS if t["name"] == params.name), "")
    if behavior == "hang":
        try:
            await anyio.sleep_forever()
        finally:
            (MARKERS / "cancelled").write_text("cancelled")
    if behavior == "big":
        text = "x" * int(os.environ["BIG_BYTES"])
    else:
        text = json.dumps(params.arguments, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("hostile", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
