"""One MCP server's tool listing as runtime ``Tool``s: names, schemas and counts checked.

Rules (``docs/mcp.md``). A server's tool is offered under ``<prefix><name>``, with each ``.`` of
its name as ``_`` (providers accept only letters, digits, ``_`` and ``-`` in a tool name). A tool
is skipped, with a warning naming the server, the tool and the reason, when:

- its name is not 1 to 64 letters, digits, ``_``, ``.`` or ``-`` (the MCP rule, bounded as
  providers bound theirs);
- its runtime name is longer than 64 characters (a shorter ``prefix`` fixes that);
- its input schema is refused (``_schema.py``: a remote ``$ref``, a regex RE2 cannot run, ...).

The other tools of the server are offered as usual. A listing of more than
``limits.mcp_max_tools`` tools, or of two tools that would have the same runtime name, is
refused as a whole (``ListingRefused``). A description longer than ``MAX_DESCRIPTION_CHARS`` is
cut, with a marker saying so: it is sent to the model with every request.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, final

import attrs

from .._limits import Limits
from .._tools.base import ExecutionMode, Tool, ToolContext, ToolResult
from ._schema import SchemaRefused, untrusted_validator
from ._schema_check import shown

__all__ = ["MAX_DESCRIPTION_CHARS", "Listing", "ListingRefused", "build_tools", "log"]

#: A server's own tool name.
SERVER_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Longest runtime tool name (providers refuse longer ones).
MAX_NAME: Final = 64
#: Longest tool description kept, in characters.
MAX_DESCRIPTION_CHARS: Final = 8_192

log: Final = logging.getLogger("dsh_agent_loop.mcp")

Call = Callable[[str, Mapping[str, Any]], Awaitable[ToolResult]]


@final
class ListingRefused(Exception):
    """A listing the runtime does not use at all (too many tools, two with one name)."""


@final
@attrs.frozen
class Listing:
    """The tools of one listing that the runtime offers, and those it skipped."""

    tools: tuple[Tool, ...]
    origins: Mapping[str, str]
    """Runtime tool name → the server's own name for it."""
    skipped: Mapping[str, str]
    """Server tool name → why it is not offered."""


def _name_problem(name: Any, prefix: str) -> str | None:
    if not isinstance(name, str) or SERVER_TOOL_NAME.fullmatch(name) is None:
        return "its name is not 1 to 64 letters, digits, '_', '.' or '-'"
    runtime = prefix + name.replace(".", "_")
    if len(runtime) > MAX_NAME:
        return (
            f"its name here, {runtime!r}, is longer than {MAX_NAME} characters"
            " (give the server a shorter prefix)"
        )
    return None


def _description(listed: Any) -> str:
    text = listed.description or listed.title or ""
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return str(text)
    cut = len(text) - MAX_DESCRIPTION_CHARS
    return f"{text[:MAX_DESCRIPTION_CHARS]}… [description cut: {cut:,} more characters]"


def _mode(listed: Any, overrides: Mapping[str, Any]) -> ExecutionMode:
    mode: ExecutionMode | None = overrides.get(listed.name)
    if mode is None:
        hints = listed.annotations
        mode = "parallel" if hints is not None and hints.read_only_hint else "exclusive"
    return mode


def _tool(listed: Any, runtime_name: str, mode: ExecutionMode, call: Call) -> Tool:
    """A runtime ``Tool`` for a listed tool whose name passed (``SchemaRefused`` if its schema)."""
    validator = untrusted_validator(listed.input_schema)
    name = listed.name

    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        return await call(name, arguments)

    return Tool(
        name=runtime_name,
        description=_description(listed),
        parameters=listed.input_schema,
        handler=handler,
        execution_mode=mode,
        validator=validator,
    )


def build_tools(
    server: str,
    prefix: str,
    overrides: Mapping[str, Any],
    listed: Sequence[Any],
    call: Call,
    limits: Limits,
) -> Listing:
    """The runtime tools for ``listed`` (one server's ``tools/list``, all pages).

    Raises:
        ListingRefused: more tools than ``limits.mcp_max_tools``, or two with one runtime name.
    """
    if len(listed) > limits.mcp_max_tools:
        raise ListingRefused(
            f"it lists {len(listed):,} tools, more than the limit of {limits.mcp_max_tools:,}"
            " (limits.mcpMaxTools)"
        )
    tools: list[Tool] = []
    origins: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for item in listed:
        problem = _name_problem(item.name, prefix)
        runtime_name = prefix + str(item.name).replace(".", "_")
        if problem is None and runtime_name in origins:
            raise ListingRefused(
                f"its tools {origins[runtime_name]!r} and {item.name!r} would both be"
                f" {runtime_name!r}"
            )
        if problem is None:
            try:
                tools.append(_tool(item, runtime_name, _mode(item, overrides), call))
            except SchemaRefused as exc:
                problem = f"its input schema is refused: {exc}"
            else:
                origins[runtime_name] = item.name
                continue
        skipped[str(item.name)[:200]] = problem
        log.warning("MCP server %r: tool %s skipped: %s", server, shown(item.name), problem)
    return Listing(tuple(tools), origins, skipped)
