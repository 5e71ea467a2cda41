"""Context accounting and surface replacement (``docs/context.md``; compaction: ``compaction.py``).

**Accounting.** A request's input size is known before it is sent: the provider's reported
``input_tokens`` of the latest request, plus an estimate of what the surface gained since
(``CHARS_PER_TOKEN`` characters a token, ``MESSAGE_OVERHEAD`` tokens a message). The estimate of
the whole request is a floor, so a provider that under-reports (or none that reports) cannot
hide a growing history. A user ``token_counter`` counts the whole request instead.

**Replacement.** ``replace_history`` appends one ``user/message`` or ``assistant/message`` with a
replace ``surface_op`` (docs/design.md#context-and-compaction): only between turns or inside
``agent/pre-step``, never over
node 0, never splitting a tool call from its result, and only over events on the surface.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import attrs

from .._errors import InvalidOptionError
from .._frozen import FrozenDict, freeze
from ..events import ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE, Event
from ._tokens import CHARS_PER_TOKEN as CHARS_PER_TOKEN
from ._tokens import MESSAGE_OVERHEAD as MESSAGE_OVERHEAD
from ._tokens import ContextTracker as ContextTracker
from ._tokens import estimate_tokens as estimate_tokens
from ._tokens import message_chars as message_chars
from .inbox import user_message

if TYPE_CHECKING:
    from ..llm import PreparedCall
    from ._turn_context import TurnContext
    from .options import CompactionPolicy

__all__ = [
    "CHARS_PER_TOKEN",
    "MESSAGE_OVERHEAD",
    "ContextTracker",
    "ContextUsage",
    "append_replacement",
    "check_range",
    "closed_end",
    "context_usage",
    "count_tokens",
    "estimate_tokens",
    "message_chars",
    "replace_history",
]


@final
@attrs.frozen
class ContextUsage:
    """How full the next request is: ``tokens`` of ``window`` (``ratio`` is their quotient)."""

    tokens: int
    """Estimated input tokens of the next request (see ``docs/context.md``)."""
    window: int | None
    """The route's context window (model table or config); None until known."""
    ratio: float | None
    """``tokens / window``; None when the window is unknown."""


def _window(agent: TurnContext, prepared: PreparedCall | None) -> int | None:
    if prepared is not None and prepared.context_window is not None:
        return prepared.context_window
    context = agent.log.state.context
    window = context.get("context_window") if context is not None else None
    return int(window) if window else None


def count_tokens(
    agent: TurnContext,
    policy: CompactionPolicy | None,
    pending: Sequence[FrozenDict] = (),
    schemas: Sequence[Mapping[str, Any]] | None = None,
) -> int:
    """Estimated input tokens of the next request (its history plus ``pending`` messages)."""
    if policy is not None and policy.token_counter is not None:
        return int(policy.token_counter([*agent.log.derive_messages(), *pending]))
    tracker = agent.context
    if tracker is None:
        tracker = agent.context = ContextTracker()
    chars, messages = tracker.history(agent.log)
    if schemas is None:
        tools = agent.default_assembly().tools
        schema = tracker.schema_tokens(tools, [t.schema for t in tools])
    else:
        schema = tracker.schema_tokens(schemas, schemas)
    added = estimate_tokens(pending)
    floor = math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD * len(messages)
    floor += schema + added
    reported = tracker.reported(agent.log, messages)
    if reported is None:
        return floor
    tokens, count, since = reported
    since_tokens = math.ceil(since / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD * count
    return max(floor, tokens + since_tokens + added)


def context_usage(agent: TurnContext) -> ContextUsage:
    """``agent.context_usage()``: the next request's estimated size against the window."""
    tokens = count_tokens(agent, agent.compaction)
    window = _window(agent, None)
    return ContextUsage(tokens, window, None if not window else tokens / window)


# -- replacement --------------------------------------------------------------------------
def closed_end(entries: Sequence[Event], start: int, stop: int) -> int:
    """The last position before ``stop`` up to which every tool call since ``start`` is paired.

    ``start - 1`` when there is none. A result whose call is not in the range makes every
    later position unpaired too.
    """
    open_calls: set[str] = set()
    end = start - 1
    for k in range(start, stop):
        event = entries[k]
        if event.type == ASSISTANT_MESSAGE:
            for block in event.data["message"].get("content", ()):
                if block.get("type") == "tool-call":
                    open_calls.add(block["call_id"])
        elif event.type == TOOL_RESULT:
            call_id = event.data["message"].get("call_id")
            if call_id not in open_calls:
                return end  # an orphan result: no range through it is paired
            open_calls.discard(call_id)
        if not open_calls:
            end = k
    return end


def _message_data(agent: TurnContext, message: Any) -> tuple[str, FrozenDict]:
    """The event type and data of a replacement message (a string is a user message)."""
    next_id = f"m-{agent.log.inbox.max_id + 1}"
    if isinstance(message, str):
        return USER_MESSAGE, FrozenDict(message=user_message(next_id, message))
    if not isinstance(message, Mapping):
        raise InvalidOptionError(
            "replace_history message must be a string or a {role, content} mapping"
        )
    role = message.get("role", "user")
    if role == "user":
        source = message.get("source")
        return USER_MESSAGE, FrozenDict(
            message=user_message(message.get("id") or next_id, message.get("content", ""), source)
        )
    if role == "assistant":
        content = message.get("content", "")
        blocks = (FrozenDict(type="text", text=content),) if isinstance(content, str) else content
        for block in freeze(blocks):
            if not isinstance(block, Mapping) or block.get("type") == "tool-call":
                raise InvalidOptionError(
                    "a replacement assistant message holds text blocks, not tool calls"
                )
        turn = agent.log.state.turn
        frozen = FrozenDict(role="assistant", content=freeze(blocks))
        return ASSISTANT_MESSAGE, FrozenDict(turn=turn, step=0, message=frozen)
    raise InvalidOptionError(
        f"replace_history message role must be user or assistant, not {role!r}"
    )


def check_range(agent: TurnContext, start_seq: int, end_seq: int) -> tuple[int, int]:
    """The surface positions ``start_seq..end_seq`` names, if they may be replaced.

    Raises:
        InvalidOptionError: not on the current surface, touching node 0, or splitting a tool
            call from its result.
    """
    surface = agent.log.surface
    try:
        i, j = surface.check_replace({"op": "replace", "start_seq": start_seq, "end_seq": end_seq})
    except ValueError as exc:
        raise InvalidOptionError(f"cannot replace {start_seq}..{end_seq}: {exc}") from None
    nodes = surface.system_nodes
    if nodes and any(e is nodes[0] for e in surface.entries[i : j + 1]):
        raise InvalidOptionError(f"cannot replace {start_seq}..{end_seq}: it covers node 0")
    if closed_end(surface.entries, i, j + 1) != j:
        raise InvalidOptionError(
            f"cannot replace {start_seq}..{end_seq}: it splits a tool call from its result"
        )
    return i, j


def append_replacement(
    agent: TurnContext, start_seq: int, end_seq: int, event_type: str, data: FrozenDict
) -> Event:
    """Append ``data`` as a replacement of ``start_seq..end_seq`` (checked first)."""
    check_range(agent, start_seq, end_seq)
    op = FrozenDict(op="replace", start_seq=start_seq, end_seq=end_seq)
    return agent.log.add(event_type, data, surface_op=op)


def replace_history(agent: TurnContext, start_seq: int, end_seq: int, message: Any) -> Event:
    """``agent.replace_history``: replace a surface range by one message (see the module doc)."""
    turn = agent.running_turn
    if turn is not None and not turn.in_pre_step:
        raise InvalidOptionError(
            "replace_history runs between turns or inside an agent/pre-step listener"
        )
    for value in (start_seq, end_seq):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidOptionError(f"replace_history seqs must be integers, got {value!r}")
    event_type, data = _message_data(agent, message)
    return append_replacement(agent, start_seq, end_seq, event_type, data)
