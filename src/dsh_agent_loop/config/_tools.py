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
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

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


def is_tool_ref(text: str) -> bool:
    """Whether ``text`` is a ``module:attr`` reference rather than a tool name."""
    return ":" in text


def _check(
    entries: Sequence[Any], path: KeyPath, known: frozenset[str], catalog: ToolCatalog
) -> tuple[set[str], list[Fault]]:
    """The names one list gives (plain and loaded), and its faults."""
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
) -> Iterator[Fault]:
    """Faults of the ``tools`` lists of a raw plugin block (tolerating bad shapes).

    Args:
        block: The raw plugin ``config`` mapping.
        path: Its key path in the file.
        known: Names of runtime tools given outside the config (``open_runtime(tools=...)``).
        catalog: The built-in names and the reference loader; None leaves the lists unchecked.
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
                yield from _check(own, (*path, key, index, "tools"), runtime_names, catalog)[1]
