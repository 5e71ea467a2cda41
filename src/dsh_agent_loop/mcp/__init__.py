"""MCP tool servers: each server's tools become runtime ``Tool``s (extra ``dsh-agent-loop[mcp]``).

Importing this package does not import the MCP SDK; the SDK is imported when a server starts.
``open_runtime(mcp_servers=[McpServer.stdio(...), McpServer.http(...)])`` or a top-level
``mcpServers:`` in the config declares servers; see ``docs/mcp.md``.
"""

from __future__ import annotations

from ._connection import McpConnection as McpConnection
from ._connection import McpStartError as McpStartError
from ._results import tool_result as tool_result
from ._servers import McpServers as McpServers
from ._servers import McpServersStatistics as McpServersStatistics
from ._servers import open_mcp_servers as open_mcp_servers
from ._spec import McpServer as McpServer

__all__ = [
    "McpConnection",
    "McpServer",
    "McpServers",
    "McpServersStatistics",
    "McpStartError",
    "open_mcp_servers",
    "tool_result",
]
