"""``Limits``: how much one model reply, tool result or MCP server may cost the runtime.

Everything a model or a tool server sends is untrusted input: a reply may ask for ten thousand
tool calls, a tool may return a hundred megabytes, a sub-agent may delegate to itself, an MCP
server may never answer. Each of those has a bound here with a default chosen to stop a hostile
peer long before it costs a few hundred megabytes or a minute, and a coded outcome the model
can read (docs/limits.md lists every limit, its default and what happens past it). The record
is plain data: the runtime reads it once (``open_runtime(limits=...)``, or the config's
``limits`` block) and hands it to the parts that enforce it. Stream limits belong to each
provider (``llm``), because a stream is read by its adapter.

``TurnBudget`` bounds one turn of one agent (steps, tool calls, tokens, seconds). It lives here,
beside ``Limits``, because both the agent's options and the config's records carry it: a record
both sides use sits below both.
"""

from __future__ import annotations

from typing import Final, final

import attrs

__all__ = ["DEFAULT_LIMITS", "Limits", "TurnBudget"]


def _positive_int(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Limits.{attribute.name} must be a positive integer, not {value!r}")


def _positive_number(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"Limits.{attribute.name} must be a positive number, not {value!r}")
    if value == float("inf"):
        raise ValueError(f"Limits.{attribute.name} must be finite")


@final
@attrs.frozen
class Limits:
    """The runtime's bounds on what models and tool servers send (``docs/limits.md``)."""

    max_tool_result_bytes: int = attrs.field(default=1 << 20, validator=_positive_int)
    """A tool result's text (user tool or MCP), in UTF-8 bytes; longer results are cut there
    and end with a marker saying how much was dropped."""
    max_tool_calls_per_reply: int = attrs.field(default=128, validator=_positive_int)
    """Tool calls one assistant reply may ask for; calls past it get a ``TOOL_ERROR`` result
    and never run."""
    max_delegation_depth: int = attrs.field(default=8, validator=_positive_int)
    """Parents above a sub-agent (a top-level agent's child is at depth 1); a deeper
    delegation is a ``LIMIT_EXCEEDED`` tool error."""
    max_subagents: int = attrs.field(default=1_000, validator=_positive_int)
    """Live sub-agents in one runtime at once; one more is a ``LIMIT_EXCEEDED`` tool error."""
    mcp_call_timeout: float = attrs.field(default=60.0, validator=_positive_number)
    """Seconds an MCP tool call may take; then its result is a ``TIMEOUT`` error."""
    mcp_max_tools: int = attrs.field(default=512, validator=_positive_int)
    """Tools one MCP server may offer; a longer list is a start failure of that server."""
    mcp_max_message_bytes: int = attrs.field(default=8 << 20, validator=_positive_int)
    """Bytes of one message from an MCP server; a larger message is refused, never read whole."""


#: The limits of a runtime that sets none.
DEFAULT_LIMITS: Final = Limits()


@final
@attrs.frozen
class TurnBudget:
    """Per-turn limits; exceeding one aborts the turn with cause ``hook``.

    See docs/design.md#turn-budget.

    The one budget record: agent options carry it, and the config (``turnBudget``) loads into it.
    """

    max_steps: int | None = None
    """Steps per turn."""
    max_tool_calls: int | None = None
    """Tool calls per turn."""
    max_total_tokens: int | None = None
    """Input plus output tokens over the turn."""
    max_seconds: float | None = None
    """Wall-clock (or runtime-clock) seconds per turn."""
