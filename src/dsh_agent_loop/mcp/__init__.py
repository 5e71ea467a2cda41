"""MCP tool servers: each server's tools become runtime ``Tool``s (extra ``dsh-agent-loop[mcp]``).

Importing this package does not import the MCP SDK; the SDK is imported when a server starts.
``open_runtime(mcp_servers=[McpServer.stdio(...), McpServer.http(...)])`` or a top-level
``mcpServers:`` in the config declares servers; see ``docs/mcp.md``.
"""

from __future__ import annotations

from .connection import McpConnection as McpConnection
from .connection import McpStartError as McpStartError
from .results import tool_result as tool_result
from .servers import McpServers as McpServers
from .servers import McpServersStatistics as McpServersStatistics
from .servers import open_mcp_servers as open_mcp_servers
from .spec import McpServer as McpServer

__all__ = [
    "McpConnection",
    "McpServer",
    "McpServers",
    "McpServersStatistics",
    "McpStartError",
    "open_mcp_servers",
    "tool_result",
]
