"""``sessions show`` in plain words: what was asked, answered and run, and what it cost.

The event types and their fields are the log's vocabulary (docs/events.md); a person reading a
session wants the conversation instead: who said what, which tools ran, how each turn ended,
and the token totals. Every stored event still gets one line, numbered by its position in the
log, so a line can be found again with ``sessions export``; only the wording is translated.
Events a user never caused directly (model settings, queue bookkeeping) are kept, in words.

Some words need the rest of the log (``Reading``, built once per log): a compaction's summary
names the range it replaced and the tokens before and after (from its ``context/compaction``
record, whose own line is the summary call and its usage); a call deferred for approval reads as
waiting while no ``tool/approval`` decided it; a fork's first request says it is a fork's. The
closing summary of ``run`` uses these words too, so the CLI has one vocabulary for a log.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

import attrs

from .._agent.compaction import SUMMARY_HEADER
from .._frozen import thaw
from .._session.projections import ApprovalState
from ..events import (
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    CONTEXT_COMPACTION,
    INBOX_SPLICED,
    PERMISSIONS_ALLOWED,
    REQUEST_CONTEXT,
    REQUEST_HEADER,
    SESSION_END_SEED,
    STEP_END,
    STEP_START,
    SYSTEM_MESSAGE,
    TOOL_APPROVAL,
    TOOL_APPROVAL_REQUESTED,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
)
from ._render import failure_words, message_text, snippet, tool_call_names

__all__ = [
    "Reading",
    "Totals",
    "pending_approvals",
    "plain_line",
    "totals",
    "transcript_lines",
    "turn_end_words",
]

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
    if kind == "awaiting-approval":
        n = len(reason.get("call_ids") or ())
        return f"stopped to wait for approval of {_count(n, 'tool call')}"
    if kind == "max-tokens":
        return "stopped at the token limit"
    return str(kind)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def _usage_words(usage: Mapping[str, Any] | None) -> str:
    usage = usage or {}
    return f"{usage.get('input_tokens', 0):,} in, {usage.get('output_tokens', 0):,} out"


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
        parts.append(f"[{_usage_words(usage)}]")
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


@final
@attrs.frozen
class Reading:
    """What the words of one event need from the rest of its log."""

    compactions: Mapping[int, Mapping[str, Any]] = attrs.field(factory=dict)
    """Summary seq → its ``context/compaction`` record."""
    requested: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    """Call id → its ``tool/approval-requested`` data, for every call deferred for approval."""
    pending: frozenset[str] = frozenset()
    """Calls deferred for approval that no ``tool/approval`` decided yet."""
    fork_request: int | None = None
    """Seq of a fork's first ``request/header`` (the first after an inherited seed end)."""

    @classmethod
    def of(cls, events: Sequence[Event]) -> Reading:
        """Read ``events`` once."""
        compactions: dict[int, Mapping[str, Any]] = {}
        requested: dict[str, Mapping[str, Any]] = {}
        state = ApprovalState()  # the runtime's own projection says which calls still wait
        forked = False
        fork_request = None
        for event in events:
            t, data = event.type, event.data
            if t in state.types:
                with contextlib.suppress(KeyError, TypeError, AttributeError):
                    state.fold(event)  # a malformed stored event is shown, not fatal
            if t == CONTEXT_COMPACTION and isinstance(data.get("summary_seq"), int):
                compactions[data["summary_seq"]] = data
            elif t == TOOL_APPROVAL_REQUESTED:
                requested[str(data.get("call_id"))] = data
            elif t == SESSION_END_SEED and data.get("inherited"):
                forked = True
            elif t == REQUEST_HEADER and forked and fork_request is None:
                fork_request = event.seq
        pending = frozenset(str(e.data.get("call_id")) for e in state.pending())
        return cls(compactions, requested, pending, fork_request)


def pending_approvals(events: Sequence[Event]) -> list[Mapping[str, Any]]:
    """The ``tool/approval-requested`` data of the calls still waiting for a decision."""
    reading = Reading.of(events)
    return [data for call_id, data in reading.requested.items() if call_id in reading.pending]


def _arguments(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(thaw(value), ensure_ascii=False)
    return snippet(text, 60)


def _settings(event: Event, reading: Reading) -> str:
    data = event.data
    header = data.get("header") or {}
    config = header.get("config") or {}
    tools = len(header.get("tools") or ())
    why = {
        "initial": "first request",
        "resume": "after resuming",
        "change": "changed",
        "series": "new request series",
    }.get(str(data.get("reason")), str(data.get("reason")))
    if event.seq is not None and event.seq == reading.fork_request:
        why = "first request of this fork"
    return (
        f"model settings ({why}): {config.get('provider')}/{config.get('model')},"
        f" {_count(tools, 'tool')}"
    )


def _system(event: Event, reading: Reading) -> str:
    text = message_text(event.data.get("message") or {})
    verb = "system prompt updated" if isinstance(event.surface_op, Mapping) else "system prompt"
    return f"{verb}: {_q(text)}" if text else f"{verb}: (none)"


def _user(event: Event, reading: Reading) -> str:
    message = event.data.get("message") or {}
    text = message_text(message)
    op = event.surface_op
    if message.get("source") == "compaction" and isinstance(op, Mapping):
        record = reading.compactions.get(-1 if event.seq is None else event.seq) or {}
        tokens = ""
        if "tokens_before" in record and "tokens_after" in record:
            tokens = f", {record['tokens_before']:,} → {record['tokens_after']:,} tokens"
        body = _q(text.removeprefix(SUMMARY_HEADER))
        span = f"{op.get('start_seq')}..{op.get('end_seq')}"
        return f"compaction: events {span} replaced by a summary{tokens}: {body}"
    if isinstance(op, Mapping):
        return f"history {op.get('start_seq')}..{op.get('end_seq')} replaced by: {_q(text)}"
    who = "context" if message.get("source") == "runtime-context" else "you"
    return f"{who}: {_q(text)}"


def _compaction(event: Event, reading: Reading) -> str:
    data = event.data
    call = data.get("call")
    route = f"{call.get('provider')}/{call.get('model')}" if call else ""
    usage = f" [{_usage_words(call.get('usage'))}]" if call and call.get("usage") else ""
    failure = data.get("failure")
    if failure:
        span = f"{data.get('start_seq')}..{data.get('end_seq')}"
        return (
            f"compaction of events {span} failed: {failure.get('message', '')}"
            f" (summary call {route}{usage})"
        )
    if not call:
        return f"compaction at {data.get('summary_seq')}: summary made by your summarizer"
    return f"summary call for the compaction at {data.get('summary_seq')}: {route}{usage}"


def _tool_call(event: Event, reading: Reading) -> str:
    data = event.data
    call_id = str(data.get("call_id"))
    what = f"{data.get('name')} {snippet(str(data.get('arguments', '')), 60)}"
    if call_id in reading.pending:
        return f"tool {what} is waiting for approval"
    if call_id in reading.requested:
        return f"tool {what} needs approval"
    return f"run tool {what}"


def _approval_requested(event: Event, reading: Reading) -> str:
    data = event.data
    call_id = str(data.get("call_id"))
    what = f"{data.get('name')} {_arguments(data.get('arguments'))} ({call_id})"
    if call_id in reading.pending:
        return f"waiting for approval: {what}"
    return f"approval asked: {what}"


def _approval(event: Event, reading: Reading) -> str:
    data = event.data
    call_id = str(data.get("call_id"))
    name = (reading.requested.get(call_id) or {}).get("name", "the call")
    if data.get("decision") == "approve":
        return f"approved: {name} ({call_id})"
    why = f": {data['message']}" if data.get("message") else ""
    cause = data.get("cause")
    by = f" (by {cause})" if cause else ""
    return f"denied: {name} ({call_id}){why}{by}"


def _plain(fn: Callable[[Event], str]) -> Callable[[Event, Reading], str]:
    return lambda event, _reading: fn(event)


_WORDS: Final[Mapping[str, Callable[[Event, Reading], str]]] = {
    TURN_START: _plain(lambda e: f"turn {e.data.get('turn')} started"),
    STEP_START: _plain(lambda e: f"step {e.data.get('step')} started"),
    STEP_END: _plain(lambda e: f"step {e.data.get('step')} done"),
    TURN_END: _plain(lambda e: f"turn {e.data.get('turn')} {turn_end_words(e.data.get('reason'))}"),
    USER_MESSAGE: _user,
    SYSTEM_MESSAGE: _system,
    ASSISTANT_MESSAGE: _plain(lambda e: _assistant(e.data)),
    ASSISTANT_ATTEMPT: _plain(
        lambda e: "model call failed: " + failure_words(e.data.get("failure") or {})
    ),
    TOOL_CALL: _tool_call,
    TOOL_RESULT: _plain(lambda e: _tool_result(e.data)),
    TOOL_APPROVAL_REQUESTED: _approval_requested,
    TOOL_APPROVAL: _approval,
    PERMISSIONS_ALLOWED: _plain(lambda e: f"always allowed from now on: {e.data.get('rule')}"),
    CONTEXT_COMPACTION: _compaction,
    INBOX_SPLICED: _plain(lambda e: _queue(e.data)),
    REQUEST_HEADER: _settings,
    REQUEST_CONTEXT: _plain(lambda e: f"model: {e.data.get('provider')}/{e.data.get('model')}"),
    SESSION_END_SEED: _plain(
        lambda e: "session forked here" if e.data.get("inherited") else "session opened"
    ),
}


def plain_line(index: int, event: Event, reading: Reading | None = None) -> str:
    """``index  words`` for one stored event (``reading``: of its log, for the words it needs)."""
    fn = _WORDS.get(event.type)
    words = (
        fn(event, reading or Reading())
        if fn is not None
        else f"{event.type}: {snippet(json.dumps(thaw(event.data), default=str))}"
    )
    return f"{index:>5}  {words}"


def transcript_lines(events: Sequence[Event], start: int = 0) -> list[str]:
    """One ``plain_line`` per event of a log from ``start`` on, the log read as a whole."""
    reading = Reading.of(events)
    return [plain_line(index, events[index], reading) for index in range(start, len(events))]


#: How the totals name the turn-end kinds they count.
_END_WORDS: Final = {
    "aborted": "cancelled",
    "error": "failed",
    "blocked": "not started",
    "awaiting-approval": "stopped for approval",
    "max-tokens": "stopped at the token limit",
}


@final
@attrs.frozen
class Totals:
    """What a session used: turns, model calls, tool calls and tokens.

    ``model_calls`` counts every successful call the runtime made, the summaries made for
    compaction (``summary_calls``) among them; ``failed_calls`` the failed ones.
    """

    turns: int
    turn_ends: Mapping[str, int]
    model_calls: int
    failed_calls: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    summary_calls: int = 0
    compactions: int = 0
    waiting: int = 0
    """Calls waiting for a person's approval."""

    def lines(self) -> list[str]:
        """The summary lines ``sessions show`` prints under the header."""
        ends = ", ".join(
            f"{count} {_END_WORDS.get(kind, kind)}" for kind, count in self.turn_ends.items()
        )
        turns = _count(self.turns, "turn") + (f" ({ends})" if ends else "")
        calls = _count(self.model_calls, "model call")
        notes = []
        if self.summary_calls:
            notes.append(f"{self.summary_calls} for compaction")
        if self.failed_calls:
            notes.append(f"+{self.failed_calls} failed")
        if notes:
            calls += f" ({'; '.join(notes)})"
        parts = [turns, calls, _count(self.tool_calls, "tool call")]
        if self.compactions:
            parts.append(_count(self.compactions, "compaction"))
        total = self.input_tokens + self.output_tokens
        tokens = f"tokens: {self.input_tokens:,} in, {self.output_tokens:,} out, {total:,} total"
        out = [" · ".join(parts), tokens]
        if self.waiting:
            out.append(f"waiting for approval: {_count(self.waiting, 'tool call')}")
        return out


def totals(events: Sequence[Event]) -> Totals:
    """Count turns, model calls (compaction summaries too), tool calls and tokens in a log."""
    turns = model_calls = failed = tool_calls = tokens_in = tokens_out = 0
    summaries = compactions = 0
    ends: dict[str, int] = {}
    for event in events:
        t, data = event.type, event.data
        usage: Mapping[str, Any] = {}
        if t == TURN_START:
            turns += 1
        elif t == TURN_END:
            kind = str((data.get("reason") or {}).get("kind", "?"))
            ends[kind] = ends.get(kind, 0) + 1
        elif t == ASSISTANT_MESSAGE:
            model_calls += 1
            usage = data.get("usage") or {}
        elif t == ASSISTANT_ATTEMPT:
            failed += 1
        elif t == TOOL_CALL:
            tool_calls += 1
        elif t == CONTEXT_COMPACTION:
            compactions += data.get("summary_seq") is not None
            call = data.get("call")
            if call and data.get("failure"):
                failed += 1
            elif call:
                model_calls += 1
                summaries += 1
            usage = (call or {}).get("usage") or {}
        tokens_in += int(usage.get("input_tokens", 0) or 0)
        tokens_out += int(usage.get("output_tokens", 0) or 0)
    waiting = len(Reading.of(events).pending)
    return Totals(
        turns,
        ends,
        model_calls,
        failed,
        tool_calls,
        tokens_in,
        tokens_out,
        summaries,
        compactions,
        waiting,
    )
