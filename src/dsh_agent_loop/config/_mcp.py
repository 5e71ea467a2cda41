"""The ``mcpServers`` section: one record per MCP server, launched (stdio) or reached (HTTP).

The shape is the one users already write for other agent tools: ``{name: {command, args, env,
cwd}}`` starts a process speaking MCP on stdio, ``{name: {url, headers}}`` reaches a streamable
HTTP endpoint. One record holds both so that a key of the other transport is named as such (a
``url`` beside a ``command`` is a fault here, not an unknown key). Nothing here imports the MCP
SDK, nor ``dsh_agent_loop.mcp``: the runtime's composition (``_compose.py``) turns these records
into ``McpServer`` specs.

Relative paths resolve where the file is, as ``personaFile`` does, so a config runs the same from
any working directory (``resolve_mcp_paths``, at load): ``cwd`` from the config file's folder;
``command`` and ``args`` from the server's working directory, that is its ``cwd``, else the
config file's folder. A ``command`` without a ``/`` stays a ``PATH`` lookup. An argument is a path
when it is written as one (``.``, ``..``, ``./x``, ``../x``, ``~/x``) or when it is a plain word
naming a file there (``server.py`` beside the config); flags, package names, URLs and other words
are passed as written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal, final

import attrs

from .._frozen import FrozenDict
from .._mcp_names import SERVER_NAME as SERVER_NAME
from .._mcp_names import TOOL_PREFIX as TOOL_PREFIX
from ._agents import resolve_path
from ._rules import Fault, NonEmptyStr, frozen_map, to_tuple

__all__ = [
    "SERVER_NAME",
    "TOOL_PREFIX",
    "McpServerConfig",
    "McpToolConfig",
    "mcp_faults",
    "mcp_tool_prefixes",
    "resolve_mcp_paths",
]


@final
@attrs.frozen
class McpToolConfig:
    """Per-tool overrides of one server's tool (by the server's own tool name)."""

    execution_mode: Literal["parallel", "exclusive"] | None = None
    """None: ``parallel`` when the server marks the tool ``readOnlyHint``, else ``exclusive``."""


@final
@attrs.frozen
class McpServerConfig:
    """One entry of ``mcpServers``: exactly one of ``command`` (stdio) or ``url`` (HTTP)."""

    command: NonEmptyStr | None = None
    args: tuple[str, ...] = attrs.field(default=(), converter=to_tuple)
    env: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=frozen_map)
    cwd: NonEmptyStr | None = None
    url: NonEmptyStr | None = None
    headers: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=frozen_map)
    prefix: str | None = None
    """Tool names are ``<prefix><tool>``; None: ``<server name>__``."""
    tools: Mapping[str, McpToolConfig] = attrs.field(factory=FrozenDict, converter=frozen_map)


_STDIO_KEYS: Final = ("command", "args", "env", "cwd")
_HTTP_KEYS: Final = ("url", "headers")


def mcp_faults(raw: Mapping[Any, Any]) -> Iterator[Fault]:
    """Cross-key rules of ``mcpServers`` on the raw tree (bad shapes are left to structuring)."""
    key = "mcp_servers" if "mcp_servers" in raw else "mcpServers"
    section = raw.get(key)
    if not isinstance(section, Mapping):
        return
    for name, entry in section.items():
        if not isinstance(name, str) or not isinstance(entry, Mapping):
            continue
        path = (key, name)
        if not SERVER_NAME.fullmatch(name):
            yield path, "a server name is 1 to 64 letters, digits, '_' or '-'"
        prefix = entry.get("prefix")
        if isinstance(prefix, str) and not TOOL_PREFIX.fullmatch(prefix):
            yield (*path, "prefix"), "a prefix is at most 63 letters, digits, '_' or '-'"
        has_command = entry.get("command") is not None
        has_url = entry.get("url") is not None
        if has_command and has_url:
            yield (*path, "url"), "give either 'command' (stdio) or 'url' (HTTP), not both"
        elif not has_command and not has_url:
            yield path, "required key missing: 'command' (stdio) or 'url' (HTTP)"
        elif has_command:
            yield from (((*path, k), "only valid with 'url'") for k in _HTTP_KEYS if k in entry)
        else:
            yield from (
                ((*path, k), "only valid with 'command'") for k in _STDIO_KEYS if k in entry
            )


def mcp_tool_prefixes(raw: Mapping[Any, Any]) -> dict[str, str]:
    """The declared servers' tool-name prefixes, each to its server's name."""
    section = raw.get("mcp_servers" if "mcp_servers" in raw else "mcpServers")
    if not isinstance(section, Mapping):
        return {}
    prefixes: dict[str, str] = {}
    for name, entry in section.items():
        if not isinstance(name, str) or not isinstance(entry, Mapping):
            continue
        prefix = entry.get("prefix")
        prefix = f"{name}__" if prefix is None else prefix
        if isinstance(prefix, str):
            prefixes[prefix] = name
    return prefixes


def _is_path_form(arg: str) -> bool:
    """``.``, ``..``, ``./x``, ``../x``, ``~/x``: an argument written as a relative path."""
    return arg in (".", "..") or arg.startswith(("./", "../", "~/"))


def _resolve_arg(workdir: str, arg: str) -> str:
    if _is_path_form(arg):
        return resolve_path(workdir, arg)
    plain = arg and not arg.startswith(("-", "/", "~")) and "://" not in arg and "=" not in arg
    if plain and os.path.isfile(os.path.join(workdir, arg)):
        return resolve_path(workdir, arg)
    return arg


def _resolved(record: McpServerConfig, base_dir: str) -> McpServerConfig:
    if record.command is None:
        return record
    cwd = None if record.cwd is None else resolve_path(base_dir, record.cwd)
    workdir = cwd or base_dir
    command = os.path.expanduser(record.command)
    if "/" in command:
        command = resolve_path(workdir, command)
    args = tuple(_resolve_arg(workdir, arg) for arg in record.args)
    return attrs.evolve(record, command=command, args=args, cwd=cwd)


def resolve_mcp_paths(
    servers: Mapping[str, McpServerConfig], base_dir: str
) -> Mapping[str, McpServerConfig]:
    """``servers`` with their relative paths resolved (the rule above), from ``base_dir``."""
    return FrozenDict({name: _resolved(record, base_dir) for name, record in servers.items()})
