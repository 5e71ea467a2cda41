"""``McpServer``: how to reach one MCP server (a command on stdio, or a streamable HTTP URL).

A config's ``mcpServers`` entries become these specs in the runtime's composition
(``_compose.py``); this package never reads config records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, final

import attrs

from .._frozen import FrozenDict
from .._mcp_names import SERVER_NAME, TOOL_PREFIX
from .._tools.base import ExecutionMode

__all__ = ["McpServer"]


def _strs(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _frozen_strs(value: Mapping[str, str] | None) -> FrozenDict | None:
    return None if value is None else FrozenDict(value)


@final
@attrs.frozen
class McpServer:
    """One MCP server whose tools the runtime offers (build it with ``stdio`` or ``http``)."""

    name: str
    """Names the server in tool names (``<name>__<tool>``) and in ``start_failures``."""
    command: str | None = None
    """stdio: the executable started as the server's process."""
    args: tuple[str, ...] = attrs.field(default=(), converter=_strs)
    env: FrozenDict | None = attrs.field(default=None, converter=_frozen_strs)
    """stdio: variables set over the SDK's default environment (``PATH``, ``HOME``, ...)."""
    cwd: str | None = None
    url: str | None = None
    """Streamable HTTP: the endpoint URL."""
    headers: FrozenDict | None = attrs.field(default=None, converter=_frozen_strs)
    server: Any = attrs.field(default=None, eq=False)
    """In process: an SDK server object (``MCPServer`` or a low-level ``Server``)."""
    prefix: str | None = None
    """Tool names are ``<prefix><tool>`` (at most 64 characters); None: ``<name>__``."""
    execution_modes: FrozenDict = attrs.field(factory=FrozenDict, converter=FrozenDict)
    """Server tool name → ``parallel`` / ``exclusive``, over the ``readOnlyHint`` default."""

    def __attrs_post_init__(self) -> None:
        if sum(x is not None for x in (self.command, self.url, self.server)) != 1:
            raise ValueError("an MCP server has one of a command, a url or a server object")
        if not SERVER_NAME.fullmatch(self.name):
            raise ValueError(
                f"an MCP server's name is 1 to 64 letters, digits, '_' or '-', not {self.name!r}"
            )
        if self.prefix is not None and not TOOL_PREFIX.fullmatch(self.prefix):
            raise ValueError(
                f"an MCP server's tool prefix is at most 63 letters, digits, '_' or '-', not"
                f" {self.prefix!r}"
            )

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        *,
        prefix: str | None = None,
        execution_modes: Mapping[str, ExecutionMode] | None = None,
    ) -> McpServer:
        """A server started as ``command *args`` and spoken to over its stdin and stdout."""
        return cls(
            name,
            command=command,
            args=tuple(args),
            env=env,
            cwd=cwd,
            prefix=prefix,
            execution_modes=FrozenDict(execution_modes or {}),
        )

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        prefix: str | None = None,
        execution_modes: Mapping[str, ExecutionMode] | None = None,
    ) -> McpServer:
        """A server reached over streamable HTTP at ``url``, sending ``headers`` each request."""
        return cls(
            name,
            url=url,
            headers=headers,
            prefix=prefix,
            execution_modes=FrozenDict(execution_modes or {}),
        )

    @classmethod
    def in_process(
        cls,
        name: str,
        server: Any,
        *,
        prefix: str | None = None,
        execution_modes: Mapping[str, ExecutionMode] | None = None,
    ) -> McpServer:
        """A server object of the SDK (``MCPServer``) run in the runtime's own process.

        It runs as tasks beside the client, over memory streams: for tests (it works under a
        ``MockClock`` and ``explore_cancellation``) and for tools that need no process.
        """
        return cls(
            name, server=server, prefix=prefix, execution_modes=FrozenDict(execution_modes or {})
        )

    @property
    def tool_prefix(self) -> str:
        """What the server's tool names are prefixed with."""
        return f"{self.name}__" if self.prefix is None else self.prefix
