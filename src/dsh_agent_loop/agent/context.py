"""Context accounting and surface replacement (``docs/context.md``; compaction: ``compaction.py``).

**Accounting.** A request's input size is known before it is sent: the provider's reported
``input_tokens`` of the latest request, plus an estimate of what the surface gained since
(``CHARS_PER_TOKEN`` characters a token, ``MESSAGE_OVERHEAD`` tokens a message). The estimate of
the whole request is a floor, so a provider that under-reports (or none that reports) cannot
hide a growing history. A user ``token_counter`` counts the whole request instead.

**Replacement.** ``replace_history`` appends one ``user/message`` or ``assistant/message`` with a
replace ``surface_op`` (SPEC §4): only between turns or inside ``agent/pre-step``, never over
node 0, never splitting a tool call from its result, and only over events on the surface.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._frozen import FrozenDict, freeze
from ..errors import InvalidOptionError
from ..events import ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE, Event
from .inbox import user_message
from .options import CompactionPolicy

if TYPE_CHECKING:
    from ..llm.base import PreparedCall
    from .driver import Agent

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

#: Characters per token of the built-in estimate.
CHARS_PER_TOKEN: Final = 4
#: Tokens a message costs beyond its text (role, separators).
MESSAGE_OVERHEAD: Final = 4


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


# -- accounting ---------------------------------------------------------------------------
def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(k) + _text_chars(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_text_chars(v) for v in value)
    return 0 if value is None else len(str(value))


def message_chars(message: Mapping[str, Any]) -> int:
    """Characters of a derived message the estimate counts (text, reasoning, calls, results)."""
    total = 0
    for block in message.get("content", ()):
        kind = block.get("type")
        if kind in ("text", "reasoning", "tool-result"):
            total += len(block.get("text") or "")
        elif kind == "tool-call":
            total += len(block.get("name") or "") + _text_chars(block.get("arguments"))
        else:
            total += _text_chars(block)
    return total


def estimate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The built-in estimate of ``messages``: characters / ``CHARS_PER_TOKEN`` plus overhead."""
    chars = sum(message_chars(m) for m in messages)
    return math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD * len(messages)


@final
class ContextTracker:
    """One agent's running estimate of its history (made on first use).

    Everything is incremental: the character count grows with the messages appended since the
    last call, and the latest reported usage is found by looking only at the events appended
    since. A replacement (the surface generation moves) starts the count over.
    """

    __slots__ = (
        "_anchor",
        "_anchor_chars",
        "_chars",
        "_count",
        "_generation",
        "_schema_tokens",
        "_schemas",
        "_seen",
    )

    def __init__(self) -> None:
        self._generation = -1
        self._count = 0
        self._chars = 0
        self._schemas: Any = None
        self._schema_tokens = 0
        self._seen = 0
        self._anchor: tuple[int, int] | None = None
        """``(input_tokens, position)``: the latest report and how many messages it covered."""
        self._anchor_chars = 0
        """Characters of the messages before the anchor's position."""

    def schema_tokens(self, key: Any, schemas: Sequence[Mapping[str, Any]]) -> int:
        """The estimate of the tool schemas (remembered while ``key`` is the same object)."""
        if key is not self._schemas:
            self._schemas, self._schema_tokens = key, _schema_tokens(schemas)
        return self._schema_tokens

    def history(self, agent: Agent) -> tuple[int, Sequence[FrozenDict]]:
        """Characters of the whole derived history, and the history (O(new messages))."""
        surface = agent.log.surface
        messages = surface.messages()
        if surface.generation != self._generation or len(messages) < self._count:
            self._generation, self._count, self._chars = surface.generation, 0, 0
        for i in range(self._count, len(messages)):
            self._chars += message_chars(messages[i])
        self._count = len(messages)
        return self._chars, messages

    def reported(self, agent: Agent, messages: Sequence[FrozenDict]) -> tuple[int, int, int] | None:
        """``(input_tokens, messages since, characters since)`` of the latest usage report.

        None when no request on the current surface reported usage, or a replacement came
        after it. Call ``history`` first.
        """
        log = agent.log
        end = len(log)
        if end < self._seen:
            self._seen, self._anchor = 0, None
        for seq in range(end - 1, self._seen - 1, -1):  # the newest decides; older ones don't
            event = log.event(seq)
            op = event.surface_op
            if op is not None and op != "append":
                self._anchor = None  # the surface changed under the report
                break
            if event.type == ASSISTANT_MESSAGE:
                self._anchor = self._locate(event, messages)
                break
        self._seen = end
        if self._anchor is None:
            return None
        tokens, position = self._anchor
        return tokens, len(messages) - position, self._chars - self._anchor_chars

    def _locate(self, event: Event, messages: Sequence[FrozenDict]) -> tuple[int, int] | None:
        usage = event.data.get("usage")
        tokens = usage.get("input_tokens") if usage is not None else None
        if not tokens:
            return None
        message = event.data["message"]
        after = 0
        for position in range(len(messages) - 1, -1, -1):
            item = messages[position]
            after += message_chars(item)
            if item is message:
                self._anchor_chars = self._chars - after
                return int(tokens), position
        return None


def _schema_tokens(schemas: Sequence[Mapping[str, Any]]) -> int:
    return math.ceil(sum(_text_chars(s) for s in schemas) / CHARS_PER_TOKEN)


def _window(agent: Agent, prepared: PreparedCall | None) -> int | None:
    if prepared is not None and prepared.context_window is not None:
        return prepared.context_window
    context = agent.log.state.context
    window = context.get("context_window") if context is not None else None
    return int(window) if window else None


def count_tokens(
    agent: Agent,
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
    chars, messages = tracker.history(agent)
    if schemas is None:
        tools = agent.assembly.get(agent).tools
        schema = tracker.schema_tokens(tools, [t.schema for t in tools])
    else:
        schema = tracker.schema_tokens(schemas, schemas)
    added = estimate_tokens(pending)
    floor = math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD * len(messages)
    floor += schema + added
    reported = tracker.reported(agent, messages)
    if reported is None:
        return floor
    tokens, count, since = reported
    since_tokens = math.ceil(since / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD * count
    return max(floor, tokens + since_tokens + added)


def context_usage(agent: Agent) -> ContextUsage:
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


def _message_data(agent: Agent, message: Any) -> tuple[str, FrozenDict]:
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


def check_range(agent: Agent, start_seq: int, end_seq: int) -> tuple[int, int]:
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
    agent: Agent, start_seq: int, end_seq: int, event_type: str, data: FrozenDict
) -> Event:
    """Append ``data`` as a replacement of ``start_seq..end_seq`` (checked first)."""
    check_range(agent, start_seq, end_seq)
    op = FrozenDict(op="replace", start_seq=start_seq, end_seq=end_seq)
    return agent.log.add(event_type, data, surface_op=op)


def replace_history(agent: Agent, start_seq: int, end_seq: int, message: Any) -> Event:
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
