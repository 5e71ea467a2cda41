"""``sessions show`` in plain words: what was asked, answered and run, and what it cost.

The event types and their fields are the log's vocabulary (docs/events.md); a person reading a
session wants the conversation instead: who said what, which tools ran, how each turn ended,
and the token totals. Every stored event still gets one line, numbered by its position in the
log, so a line can be found again with ``sessions export``; only the wording is translated.
Events a user never caused directly (model settings, queue bookkeeping) are kept, in words.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

import attrs

from .._frozen import thaw
from ..events import (
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    INBOX_SPLICED,
    REQUEST_CONTEXT,
    REQUEST_HEADER,
    SESSION_END_SEED,
    STEP_END,
    STEP_START,
    SYSTEM_MESSAGE,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
)
from ._render import failure_words, message_text, snippet, tool_call_names

__all__ = ["Totals", "plain_line", "totals", "turn_end_words"]

_QUOTE: Final = 72


def _q(text: str) -> str:
    return json.dumps(snippet(text, _QUOTE), ensure_ascii=False)


def turn_end_words(reason: Mapping[str, Any] | None) -> str:
    """How a turn ended: ``completed``, ``cancelled by the user``, ``failed: ...``."""
    if reason is None:
        return "ended"
    kind = reason.get("kind")
    if kind == "completed":
        return "completed"
    if kind == "aborted":
        cause = reason.get("cause")
        by = {"user": "the user", "disposed": "shutdown", "hook": "a hook"}.get(
            str(cause), str(cause)
        )
        return f"cancelled by {by}"
    if kind == "error":
        error = reason.get("error") or {}
        return f"failed: {error.get('code', '?')}: {error.get('message', '')}".rstrip(": ")
    if kind == "interrupted":
        return "interrupted (the process stopped during the turn)"
    if kind == "blocked":
        return "not started: " + str(reason.get("reason") or "blocked by a hook")
    return str(kind)


def _assistant(data: Mapping[str, Any]) -> str:
    message = data.get("message") or {}
    parts = []
    reasoning = message_text(message, ("reasoning",))
    if reasoning:
        parts.append(f"(thought for {len(reasoning)} characters)")
    text = message_text(message)
    if text:
        parts.append(_q(text))
    calls = tool_call_names(message)
    if calls:
        parts.append("asks to run " + ", ".join(calls))
    if not parts:
        parts.append("(no reply)")
    finish = (data.get("stream") or {}).get("finish")
    if data.get("interrupted"):
        parts.append("[cut off by the cancel]")
    elif finish == "max-tokens":
        parts.append("[cut off at the token limit]")
    usage = data.get("usage") or {}
    if usage:
        parts.append(
            f"[{usage.get('input_tokens', 0):,} in, {usage.get('output_tokens', 0):,} out]"
        )
    return "assistant: " + " ".join(parts)


def _tool_result(data: Mapping[str, Any]) -> str:
    message = data.get("message") or {}
    name = message.get("name", "?")
    text = "".join(
        str(b.get("text", "")) for b in message.get("content", ()) or () if isinstance(b, Mapping)
    )
    error = data.get("error")
    if error:
        return f"tool {name} failed ({error.get('code', '?')}): {_q(text)}"
    return f"tool {name} answered {_q(text)}"


def _queue(data: Mapping[str, Any]) -> str:
    where = "next turn" if data.get("target") == "next-turn" else "next step"
    inserted = [m for m in data.get("inserted") or () if isinstance(m, Mapping)]
    removed = int(data.get("removed_count", 0) or 0)

    def count(n: int) -> str:
        return f"{n} message{'s' * (n != 1)}"

    if data.get("outcome") == "canceled":
        return f"queue: dropped {count(removed)}"
    if inserted and not removed:
        texts = _q(" | ".join(message_text(m) for m in inserted))
        return f"queue: {count(len(inserted))} waiting for the {where}: {texts}"
    if removed and not inserted:
        return f"queue: {count(removed)} taken from the queue"
    return f"queue: {count(removed)} replaced by {count(len(inserted))}"


def _settings(data: Mapping[str, Any]) -> str:
    header = data.get("header") or {}
    config = header.get("config") or {}
    tools = len(header.get("tools") or ())
    why = {
        "initial": "first request",
        "resume": "after resuming",
        "change": "changed",
        "series": "new request series",
    }.get(str(data.get("reason")), str(data.get("reason")))
    return (
        f"model settings ({why}): {config.get('provider')}/{config.get('model')},"
        f" {tools} tool{'s' * (tools != 1)}"
    )


def _system(event: Event) -> str:
    text = message_text(event.data.get("message") or {})
    verb = "system prompt updated" if isinstance(event.surface_op, Mapping) else "system prompt"
    return f"{verb}: {_q(text)}" if text else f"{verb}: (none)"


def _user(event: Event) -> str:
    message = event.data.get("message") or {}
    who = "context" if message.get("source") == "runtime-context" else "you"
    return f"{who}: {_q(message_text(message))}"


_WORDS: Final[Mapping[str, Callable[[Event], str]]] = {
    TURN_START: lambda e: f"turn {e.data.get('turn')} started",
    STEP_START: lambda e: f"step {e.data.get('step')} started",
    STEP_END: lambda e: f"step {e.data.get('step')} done",
    TURN_END: lambda e: f"turn {e.data.get('turn')} {turn_end_words(e.data.get('reason'))}",
    USER_MESSAGE: _user,
    SYSTEM_MESSAGE: _system,
    ASSISTANT_MESSAGE: lambda e: _assistant(e.data),
    ASSISTANT_ATTEMPT: lambda e: "model call failed: " + failure_words(e.data.get("failure") or {}),
    TOOL_CALL: lambda e: (
        f"run tool {e.data.get('name')} {snippet(str(e.data.get('arguments', '')), 60)}"
    ),
    TOOL_RESULT: lambda e: _tool_result(e.data),
    INBOX_SPLICED: lambda e: _queue(e.data),
    REQUEST_HEADER: lambda e: _settings(e.data),
    REQUEST_CONTEXT: lambda e: f"model: {e.data.get('provider')}/{e.data.get('model')}",
    SESSION_END_SEED: lambda e: (
        "session forked here" if e.data.get("inherited") else "session opened"
    ),
}


def plain_line(index: int, event: Event) -> str:
    """``index  words`` for one stored event."""
    fn = _WORDS.get(event.type)
    words = (
        fn(event)
        if fn is not None
        else f"{event.type}: {snippet(json.dumps(thaw(event.data), default=str))}"
    )
    return f"{index:>5}  {words}"


@final
@attrs.frozen
class Totals:
    """What a session used: turns, model calls, tool calls and tokens."""

    turns: int
    turn_ends: Mapping[str, int]
    model_calls: int
    failed_calls: int
    tool_calls: int
    input_tokens: int
    output_tokens: int

    def lines(self) -> list[str]:
        """The summary lines ``sessions show`` prints under the header."""
        ends = ", ".join(f"{count} {kind}" for kind, count in self.turn_ends.items())
        turns = f"{self.turns} turn{'s' * (self.turns != 1)}" + (f" ({ends})" if ends else "")
        calls = f"{self.model_calls} model call{'s' * (self.model_calls != 1)}"
        if self.failed_calls:
            calls += f" (+{self.failed_calls} failed)"
        tools = f"{self.tool_calls} tool call{'s' * (self.tool_calls != 1)}"
        total = self.input_tokens + self.output_tokens
        tokens = f"tokens: {self.input_tokens:,} in, {self.output_tokens:,} out, {total:,} total"
        return [f"{turns} · {calls} · {tools}", tokens]


def totals(events: Sequence[Event]) -> Totals:
    """Count turns, model calls, tool calls and tokens in a log."""
    turns = model_calls = failed = tool_calls = tokens_in = tokens_out = 0
    ends: dict[str, int] = {}
    for event in events:
        if event.type == TURN_START:
            turns += 1
        elif event.type == TURN_END:
            kind = str((event.data.get("reason") or {}).get("kind", "?"))
            ends[kind] = ends.get(kind, 0) + 1
        elif event.type == ASSISTANT_MESSAGE:
            model_calls += 1
            usage = event.data.get("usage") or {}
            tokens_in += int(usage.get("input_tokens", 0) or 0)
            tokens_out += int(usage.get("output_tokens", 0) or 0)
        elif event.type == ASSISTANT_ATTEMPT:
            failed += 1
        elif event.type == TOOL_CALL:
            tool_calls += 1
    return Totals(turns, ends, model_calls, failed, tool_calls, tokens_in, tokens_out)
