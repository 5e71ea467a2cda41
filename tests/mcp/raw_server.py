"""A hostile MCP server that writes JSON-RPC by hand, for what the SDK's server never sends.

Run as ``python raw_server.py``. It answers ``initialize`` and ``tools/list`` (one tool,
``shout``) like any server; a ``tools/call`` of ``shout`` first writes a line of
``arguments.size`` bytes that carries no JSON-RPC id, then the answer. ``MARKER_DIR`` counts
the process starts in ``starts``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import mcp_types as types


def reply(request_id: Any, result: Any) -> None:
    data = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": data})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    markers = Path(os.environ["MARKER_DIR"])
    starts = markers / "starts"
    starts.write_text(str(int(starts.read_text()) + 1 if starts.exists() else 1))
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            reply(
                request_id,
                types.InitializeResult(
                    protocol_version=message["params"]["protocolVersion"],
                    capabilities=types.ServerCapabilities(tools=types.ToolsCapability()),
                    server_info=types.Implementation(name="raw", version="1"),
                ),
            )
        elif method == "tools/list":
            shout = types.Tool(name="shout", input_schema={"type": "object"})
            reply(request_id, types.ListToolsResult(tools=[shout]))
        elif method == "tools/call":
            size = int(message["params"]["arguments"]["size"])
            sys.stdout.write('{"shout": "' + "x" * size + '"}\n')  # no id at either end
            text = types.TextContent(type="text", text="shouted")
            reply(request_id, types.CallToolResult(content=[text]))


if __name__ == "__main__":
    main()
