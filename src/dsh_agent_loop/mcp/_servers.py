"""``open_mcp_servers``: the MCP connections of one runtime, in a nursery of their own.

The runtime enters this around its root nursery's body, so the connections outlive every agent
(whose tool calls use them) and are closed only after the agents' tasks have ended. A server
that fails to start is reported, never raised: the runtime records it in ``start_failures`` and
the other servers and agents start as usual. Each server's tools are registered as runtime
tools and replaced as a whole when the server's list changes.

An agent needs the servers its tools come from: every server when its options name no subset,
else the servers whose tool prefix starts one of its names (``files__read``, or ``files__*``
for all of that server's tools). ``agent_tools`` expands those names against the live
listings, and raises the server's ``McpStartError`` when one the agent needs did not start, so
the runtime records the agent as a start failure instead of running it without its tools.

A tool name is never taken silently. At start, a server tool named like a runtime tool, a
built-in or another server's tool is that server's start failure, naming both; servers are
started at once but claim their names in the order they were given, so which one fails does
not depend on which answered first. A name that clashes in a later listing (after a
``list_changed`` or a restart) skips that tool, with a warning.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Final, final

import attrs
import trio

from .._errors import InvalidOptionError
from .._limits import DEFAULT_LIMITS, Limits
from .._tools.base import Tool
from ._connection import McpConnection, McpStartError
from ._spec import McpServer
from ._tools import Listing, log

__all__ = ["McpServers", "McpServersStatistics", "open_mcp_servers"]

AddTool = Callable[[Tool], Callable[[], None]]
Taken = Callable[[str], "str | None"]
"""``taken(name)``: what already has that tool name (``"the built-in tool 'x'"``), or None."""
#: Clashes named in one start failure.
SHOWN_CLASHES: Final = 3


def _nothing_taken(name: str) -> str | None:
    return None


@final
@attrs.frozen
class McpServersStatistics:
    """A snapshot of a runtime's MCP servers."""

    servers: int
    running: int
    starts: int
    calls: int
    tools: int
    skipped: int = 0
    """Listed tools not offered (a bad name or schema, or a clash after start)."""


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
        self._owners: dict[str, str] = {}
        """Runtime tool name → the server whose tool it is."""
        self.failures: dict[str, McpStartError] = {}
        """Servers that did not start, by name."""

    async def start(self, add_tool: AddTool, taken: Taken = _nothing_taken) -> list[McpStartError]:
        """Start every server at once; returns the failures (their tools are not added).

        Each started server's tools are added with ``add_tool`` (which returns a disposer),
        and replaced when the server says its list changed. ``taken`` names what already has
        a tool name (the runtime's tools, the built-ins), for the clash rule above.
        """
        failures: list[McpStartError] = []
        specs = list(self._servers.values())
        settled = [trio.Event() for _ in specs]

        async def start_one(index: int, spec: McpServer) -> None:
            async def publish(listing: Listing, starting: bool) -> str | None:
                if starting:  # claim names in the order the servers were given
                    for earlier in settled[:index]:
                        await earlier.wait()
                return self._claim(spec.name, listing, starting, add_tool, taken)

            connection = McpConnection(spec, publish, self.limits)
            assert self._nursery is not None  # checked in __init__
            try:
                error = await self._nursery.start(connection.run)
            finally:
                settled[index].set()
            if error is None:
                self.connections[spec.name] = connection
            else:
                self._replace(spec.name, (), add_tool)
                failures.append(error)
                self.failures[spec.name] = error

        async with trio.open_nursery() as starting:
            for index, spec in enumerate(specs):
                starting.start_soon(start_one, index, spec)
        return failures

    def _claim(
        self, server: str, listing: Listing, starting: bool, add_tool: AddTool, taken: Taken
    ) -> str | None:
        """Register the listing's tools; at start, a clash is refused (its description)."""
        kept: list[Tool] = []
        clashes: list[str] = []
        for tool in listing.tools:
            owner = self._owners.get(tool.name)
            if owner == server:
                other = None
            elif owner is not None:
                other = f"the tool {tool.name!r} of MCP server {owner!r}"
            else:
                other = taken(tool.name)
            if other is None:
                kept.append(tool)
                continue
            origin = listing.origins[tool.name]
            named = repr(origin) if origin == tool.name else f"{origin!r} ({tool.name!r} here)"
            clashes.append(f"its tool {named} has the same name as {other}")
        if clashes and starting:
            more = len(clashes) - SHOWN_CLASHES
            return "; ".join(clashes[:SHOWN_CLASHES]) + (f"; and {more} more" if more > 0 else "")
        for clash in clashes:
            log.warning("MCP server %r: %s; that tool is skipped", server, clash)
        self._replace(server, kept, add_tool)
        return None

    def _replace(self, server: str, tools: Sequence[Tool], add_tool: AddTool) -> None:
        for dispose in self._disposers.pop(server, ()):
            dispose()
        for name in [n for n, owner in self._owners.items() if owner == server]:
            del self._owners[name]
        self._disposers[server] = [add_tool(tool) for tool in tools]
        self._owners.update((tool.name, server) for tool in tools)

    def _server_of(self, name: str) -> McpServer | None:
        """The server whose (non-empty) prefix starts ``name``, the longest; else the owner's."""
        matches = [
            spec
            for spec in self._servers.values()
            if spec.tool_prefix and name.startswith(spec.tool_prefix)
        ]
        if matches:
            return max(matches, key=lambda spec: len(spec.tool_prefix))
        owner = self._owners.get(name)
        return None if owner is None else self._servers[owner]

    def agent_tools(self, names: Sequence[str] | None) -> tuple[str, ...] | None:
        """An agent's tool names with each ``<prefix>*`` expanded to that server's tools.

        Names of no server are kept as they are. None (every runtime tool) needs every server.

        Raises:
            McpStartError: a server the agent needs did not start (the server's own error).
            InvalidOptionError: a name the server it points at does not offer.
        """
        if names is None:
            for error in self.failures.values():
                raise error
            return None
        out: list[str] = []
        for name in names:
            spec = self._server_of(name)
            if spec is None:
                out.append(name)
                continue
            if spec.name in self.failures:
                raise self.failures[spec.name]
            offered = [tool for tool, owner in self._owners.items() if owner == spec.name]
            if name == f"{spec.tool_prefix}*":
                out.extend(offered)
            elif name in offered:
                out.append(name)
            else:
                raise InvalidOptionError(self._not_offered(spec, name, offered))
        return tuple(dict.fromkeys(out))  # a tool named and matched by a '*' is listed once

    def _not_offered(self, spec: McpServer, name: str, offered: Sequence[str]) -> str:
        own = name.removeprefix(spec.tool_prefix)
        connection = self.connections.get(spec.name)
        skipped = connection.skipped.get(own) if connection is not None else None
        if skipped is not None:
            return f"MCP server {spec.name!r} skipped its tool {own!r}: {skipped}"
        has = ", ".join(t.removeprefix(spec.tool_prefix) for t in offered) or "none"
        return f"MCP server {spec.name!r} has no tool {own!r} (it offers: {has})"

    def statistics(self) -> McpServersStatistics:
        """Totals over the live connections."""
        stats = [c.statistics() for c in self.connections.values()]
        return McpServersStatistics(
            servers=len(stats),
            running=sum(s.running for s in stats),
            starts=sum(s.starts for s in stats),
            calls=sum(s.calls for s in stats),
            tools=sum(s.tools for s in stats),
            skipped=sum(s.skipped for s in stats),
        )


@asynccontextmanager
async def open_mcp_servers(
    servers: Iterable[McpServer] = (), *, limits: Limits = DEFAULT_LIMITS
) -> AsyncIterator[McpServers]:
    """A nursery for MCP connections; leaving the block closes every session and process.

    Start them with ``await mcp.start(add_tool, taken)`` (servers of the same name: the last
    wins). A stdio server's process is stopped shielded and bounded, so a cancelled block leaves
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
