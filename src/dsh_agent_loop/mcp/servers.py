"""``open_mcp_servers``: the MCP connections of one runtime, in a nursery of their own.

The runtime enters this around its root nursery's body, so the connections outlive every agent
(whose tool calls use them) and are closed only after the agents' tasks have ended. A server
that fails to start is reported, never raised: the runtime records it in ``start_failures`` and
the other servers and agents start as usual. Each server's tools are registered as runtime
tools and replaced as a whole when the server's list changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import final

import attrs
import trio

from ..limits import DEFAULT_LIMITS, Limits
from ..tools.base import Tool
from .connection import McpConnection, McpStartError
from .spec import McpServer

__all__ = ["McpServers", "McpServersStatistics", "open_mcp_servers"]

AddTool = Callable[[Tool], Callable[[], None]]


@final
@attrs.frozen
class McpServersStatistics:
    """A snapshot of a runtime's MCP servers."""

    servers: int
    running: int
    starts: int
    calls: int
    tools: int


@final
class McpServers:
    """The runtime's MCP connections (``rt.mcp``), started in ``open_mcp_servers``' nursery."""

    def __init__(
        self,
        nursery: trio.Nursery | None,
        servers: Iterable[McpServer] = (),
        *,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._nursery = nursery
        self.limits = limits
        """Call timeout, tool count and message size bounds (``docs/limits.md``)."""
        self._servers = {s.name: s for s in servers}
        if self._servers and nursery is None:
            raise ValueError("MCP servers need a nursery")
        self.connections: dict[str, McpConnection] = {}
        """Live connections by server name (a server that failed to start is not here)."""
        self._disposers: dict[str, list[Callable[[], None]]] = {}

    async def start(self, add_tool: AddTool) -> list[McpStartError]:
        """Start every server at once; returns the failures (their tools are not added).

        Each started server's tools are added with ``add_tool`` (which returns a disposer),
        and replaced when the server says its list changed.
        """
        failures: list[McpStartError] = []

        async def start_one(spec: McpServer) -> None:
            connection = McpConnection(
                spec, lambda tools: self._replace(spec.name, tools, add_tool)
            )
            assert self._nursery is not None  # checked in __init__
            error = await self._nursery.start(connection.run)
            if error is None:
                self.connections[spec.name] = connection
            else:
                self._replace(spec.name, (), add_tool)
                failures.append(error)

        async with trio.open_nursery() as starting:
            for spec in self._servers.values():
                starting.start_soon(start_one, spec)
        return failures

    def _replace(self, server: str, tools: Sequence[Tool], add_tool: AddTool) -> None:
        for dispose in self._disposers.pop(server, ()):
            dispose()
        self._disposers[server] = [add_tool(tool) for tool in tools]

    def statistics(self) -> McpServersStatistics:
        """Totals over the live connections."""
        stats = [c.statistics() for c in self.connections.values()]
        return McpServersStatistics(
            servers=len(stats),
            running=sum(s.running for s in stats),
            starts=sum(s.starts for s in stats),
            calls=sum(s.calls for s in stats),
            tools=sum(s.tools for s in stats),
        )


@asynccontextmanager
async def open_mcp_servers(
    servers: Iterable[McpServer] = (), *, limits: Limits = DEFAULT_LIMITS
) -> AsyncIterator[McpServers]:
    """A nursery for MCP connections; leaving the block closes every session and process.

    Start them with ``await mcp.start(add_tool)`` (servers of the same name: the last wins).
    The SDK stops a stdio server's process shielded and bounded, so a cancelled block leaves
    no process behind either. Without servers no nursery is opened: the caller's task tree is
    what it would be without MCP.
    """
    servers = tuple(servers)
    if not servers:
        yield McpServers(None)
        return
    async with trio.open_nursery() as nursery:
        mcp = McpServers(nursery, servers, limits=limits)
        try:
            yield mcp
        finally:
            nursery.cancel_scope.cancel()
