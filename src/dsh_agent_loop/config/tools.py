"""Tools named in a config: built-in names and ``package.module:attr`` references.

A ``tools`` list (the plugin block's, for every agent, or an agent's own) holds names and
references. References are imported when the config loads, so an import failure, a missing
attribute or a value that is not a tool is a fault at its key path, never a failure at agent
start. A name must name a tool that will exist: a built-in, a runtime tool given to
``open_runtime(tools=...)``, or (in an agent's list) a tool of the plugin block's list.

What each list gives: the plugin block's references and built-in names become runtime tools
(visible to every agent whose options name no subset); an agent's references become that
agent's scoped tools, and its names become ``AgentOptions.tools``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, final

import attrs

from ..tools.base import Tool
from ..tools.builtin import BUILTIN_TOOLS
from ..tools.loader import ToolRefError, is_tool_ref, load_tool_ref
from ._rules import Fault, KeyPath
from .agents import AgentEntry, LoopConfig

__all__ = ["ToolList", "agent_tools", "runtime_tools", "tool_faults"]

_HINT: Final = f"built-ins: {', '.join(BUILTIN_TOOLS)}; or write 'package.module:attribute'"


@final
@attrs.frozen
class ToolList:
    """One resolved ``tools`` list."""

    names: tuple[str, ...]
    """The plain tool names, in order."""
    tools: tuple[Tool, ...]
    """The tools the references named, in order."""


def _resolve(
    entries: Sequence[Any], path: KeyPath, known: frozenset[str]
) -> tuple[ToolList, list[Fault]]:
    names: list[str] = []
    tools: list[Tool] = []
    faults: list[Fault] = []
    first: dict[str, int] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry.strip():
            continue  # the structuring rules report it
        at = (*path, index)
        if is_tool_ref(entry):
            try:
                loaded = load_tool_ref(entry)
            except ToolRefError as exc:
                faults.append((at, str(exc)))
                continue
            tools.extend(loaded)
            given = [t.name for t in loaded]
        elif entry in known or entry in BUILTIN_TOOLS:
            names.append(entry)
            given = [entry]
        else:
            faults.append((at, f"unknown tool {entry!r} ({_HINT})"))
            continue
        for name in given:
            if name in first:
                faults.append(
                    (at, f"tool {name!r} is given twice (also {path[-1]}[{first[name]}])")
                )
            first.setdefault(name, index)
    return ToolList(tuple(names), tuple(tools)), faults


def tool_faults(block: Mapping[Any, Any], path: KeyPath, known: Iterable[str]) -> Iterator[Fault]:
    """Faults of the ``tools`` lists of a raw plugin block (tolerating bad shapes).

    Args:
        block: The raw plugin ``config`` mapping.
        path: Its key path in the file.
        known: Names of runtime tools given outside the config (``open_runtime(tools=...)``).
    """
    runtime_names = frozenset(known)
    entries = block.get("tools")
    if isinstance(entries, list | tuple):
        resolved, faults = _resolve(entries, (*path, "tools"), runtime_names)
        yield from faults
        runtime_names |= {*resolved.names, *(t.name for t in resolved.tools)}
    for key in ("agents", "subagents"):
        agents = block.get(key)
        if not isinstance(agents, list | tuple):
            continue
        for index, agent in enumerate(agents):
            own = agent.get("tools") if isinstance(agent, Mapping) else None
            if isinstance(own, list | tuple):
                yield from _resolve(own, (*path, key, index, "tools"), runtime_names)[1]


def runtime_tools(plugin: LoopConfig, known: Iterable[str] = ()) -> tuple[Tool, ...]:
    """The runtime tools of a validated plugin block's ``tools``: references and built-ins.

    Names in ``known`` (tools given to ``open_runtime``) are left to the caller.

    Raises:
        ToolRefError: a reference no longer loads (it did when the config was validated).
    """
    known = frozenset(known)
    listed = _resolve(plugin.tools, ("tools",), known)[0]
    builtins = tuple(BUILTIN_TOOLS[n] for n in listed.names if n not in known)
    return (*builtins, *listed.tools)


def agent_tools(entry: AgentEntry) -> ToolList:
    """A validated agent entry's ``tools``: its names (options) and its referenced tools.

    Raises:
        ToolRefError: a reference no longer loads (it did when the config was validated).
    """
    names: list[str] = []
    tools: list[Tool] = []
    for item in entry.tools or ():
        if is_tool_ref(item):
            tools.extend(load_tool_ref(item))
        else:
            names.append(item)
    return ToolList(tuple(names), tuple(tools))
