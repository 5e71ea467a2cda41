"""Tools named in a config: built-in names and ``package.module:attr`` references.

A ``tools`` list (the plugin block's, for every agent, or an agent's own) holds names and
references, kept as the strings they are written as. A name must name a tool that will exist: a
built-in, a runtime tool given to ``open_runtime(tools=...)``, or (in an agent's list) a tool of
the plugin block's list; a reference must load and name tools; no tool may be given twice.

Checking that needs the tools themselves, which this package does not import: the loader is
handed a ``ToolCatalog`` (the runtime's composition, ``_compose.py``, gives the real one, so
``dsh_agent_loop.load_config`` and ``open_runtime`` import every reference when the config loads
and a fault names its key path, never failing at agent start). Without a catalog the lists are
left unchecked here. Turning the strings into tools is the composition's work too.

What each list gives: the plugin block's references and built-in names become runtime tools
(visible to every agent whose options name no subset); an agent's references become that
agent's scoped tools, and its names become ``AgentOptions.tools``.

An agent's (or sub-agent's) list may also name the tools of a server of ``mcpServers``, whose
tools are only known once it runs: ``<prefix><tool>`` (``files__read``) or ``<prefix>*`` for all
of them, the prefix being the server's (``<server>__`` unless it sets one). Here such a name
only has to point at a declared server; the runtime expands ``*`` and checks the tool once the
server has listed its tools.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

from ._rules import Fault, KeyPath

__all__ = ["ToolCatalog", "is_tool_ref", "tool_faults"]


class ToolCatalog(Protocol):
    """What the rules of ``tools`` lists need to know of tools, from outside the config."""

    @property
    def builtin(self) -> Collection[str]:
        """The built-in tools' names, in the order a hint lists them."""
        ...

    def names(self, ref: str) -> tuple[str, ...]:
        """The names of the tools ``ref`` (``package.module:attr``) names, importing it.

        Raises:
            ValueError: the reference does not load; the message says why and names it.
        """
        ...


#: What follows a server's prefix in a tool name: the tool (as the runtime names it), or ``*``.
_MCP_TOOL: Final = re.compile(r"[A-Za-z0-9_-]+|\*")


def _mcp_fault(entry: str, servers: Mapping[str, str]) -> str | None:
    """Why ``entry`` is not a name of a declared server's tool (None: it is one; "": no MCP form).

    ``servers`` maps each declared server's tool prefix to the server's name. The tools of a
    server whose prefix is empty have plain names, which only the running server can check.
    """
    prefix = max((p for p in servers if p and entry.startswith(p)), key=len, default=None)
    if prefix is not None:
        if _MCP_TOOL.fullmatch(entry[len(prefix) :]):
            return None
        return (
            f"{entry!r} names no tool of MCP server {servers[prefix]!r}: after {prefix!r} comes"
            " a tool's name (letters, digits, '_' and '-', a '.' written '_') or '*'"
        )
    named = entry.split("__", 1)[0] if "__" in entry else None
    own = {name: p for p, name in servers.items()}
    if named in own:
        return f"MCP server {named!r} has the tool prefix {own[named]!r}: write {own[named]}<tool>"
    if "" in servers and _MCP_TOOL.fullmatch(entry) and entry != "*":
        return None
    declared = ", ".join(sorted(own)) or "none"
    if named is not None:
        return f"unknown MCP server {named!r} in {entry!r} (mcpServers declares: {declared})"
    if entry.endswith("*"):
        return f"{entry!r}: '*' names every tool of one MCP server (declared: {declared})"
    return ""


def is_tool_ref(text: str) -> bool:
    """Whether ``text`` is a ``module:attr`` reference rather than a tool name."""
    return ":" in text


def _check(
    entries: Sequence[Any],
    path: KeyPath,
    known: frozenset[str],
    catalog: ToolCatalog,
    servers: Mapping[str, str] | None = None,
) -> tuple[set[str], list[Fault]]:
    """The names one list gives (plain and loaded), and its faults.

    ``servers`` (an agent's list): declared MCP servers' tool prefixes, to their names.
    """
    given_names: set[str] = set()
    faults: list[Fault] = []
    first: dict[str, int] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry.strip():
            continue  # the structuring rules report it
        at = (*path, index)
        if is_tool_ref(entry):
            try:
                given = catalog.names(entry)
            except ValueError as exc:
                faults.append((at, str(exc)))
                continue
        elif entry in known or entry in catalog.builtin:
            given = (entry,)
        elif servers is not None and (problem := _mcp_fault(entry, servers)) != "":
            if problem is not None:
                faults.append((at, problem))
                continue
            given = (entry,)
        else:
            hint = f"built-ins: {', '.join(catalog.builtin)}; or write 'package.module:attribute'"
            faults.append((at, f"unknown tool {entry!r} ({hint})"))
            continue
        for name in given:
            if name in first:
                faults.append(
                    (at, f"tool {name!r} is given twice (also {path[-1]}[{first[name]}])")
                )
            first.setdefault(name, index)
        given_names.update(given)
    return given_names, faults


def tool_faults(
    block: Mapping[Any, Any],
    path: KeyPath,
    known: Iterable[str],
    catalog: ToolCatalog | None,
    mcp_prefixes: Mapping[str, str] | None = None,
) -> Iterator[Fault]:
    """Faults of the ``tools`` lists of a raw plugin block (tolerating bad shapes).

    Args:
        block: The raw plugin ``config`` mapping.
        path: Its key path in the file.
        known: Names of runtime tools given outside the config (``open_runtime(tools=...)``).
        catalog: The built-in names and the reference loader; None leaves the lists unchecked.
        mcp_prefixes: The declared MCP servers' tool prefixes, each to its server's name
            (``config._mcp.mcp_tool_prefixes``), which agents' lists may name tools of.
    """
    if catalog is None:
        return
    runtime_names = frozenset(known)
    entries = block.get("tools")
    if isinstance(entries, list | tuple):
        names, faults = _check(entries, (*path, "tools"), runtime_names, catalog)
        yield from faults
        runtime_names |= names
    for key in ("agents", "subagents"):
        agents = block.get(key)
        if not isinstance(agents, list | tuple):
            continue
        for index, agent in enumerate(agents):
            own = agent.get("tools") if isinstance(agent, Mapping) else None
            if isinstance(own, list | tuple):
                at = (*path, key, index, "tools")
                yield from _check(own, at, runtime_names, catalog, mcp_prefixes or {})[1]
