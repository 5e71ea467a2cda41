"""Compaction: summarise the older surface and replace it (``docs/context.md``).

Before a step whose estimated input reaches the policy's trigger, the surface after node 0 and
before the kept turns (never splitting a tool call from its result) is summarised and replaced
by one ``user/message`` with ``source: compaction``; the replacement moves the surface
generation, so the next request starts a new series (docs/design.md#request-series). Nothing is
appended until the summary is in hand: a cancel during the summary call leaves the log as it was.

Every compaction that got as far as a summary leaves a ``context/compaction`` record right after
it (docs/design.md#context-and-compaction): the replaced range, the estimated tokens before and
after, and the summary call's route and usage, so the log holds every model call the runtime
made and what it cost. A summary call that failed leaves the record too, with its ``failure``
and no summary. The record is ``ignorable``: a reader that predates it skips it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import trio

from .._errors import AgentClosedError, AgentLoopError, InvalidOptionError
from .._frozen import FrozenDict, freeze
from ..events import (
    AGENT_ERROR,
    CONTEXT_COMPACTED,
    CONTEXT_COMPACTION,
    SYSTEM_MESSAGE,
    TURN_START,
    USER_MESSAGE,
    Event,
    make_event,
)
from ..llm import Finish, ModelError, TextDelta, Usage, UsageChunk, make_request
from .context import CHARS_PER_TOKEN, append_replacement, closed_end, count_tokens
from .inbox import user_message
from .options import CompactionPolicy

if TYPE_CHECKING:
    from ..llm import PreparedCall
    from ._turn_context import StepState, TurnContext

__all__ = [
    "CONTEXT_COMPACTED",
    "SUMMARY_PROMPT",
    "Compacted",
    "CompactionError",
    "SummaryCall",
    "after_overflow",
    "before_request",
    "compact",
    "compact_now",
    "plan",
    "transcript",
]

#: Share of the window the default summary request may fill with the transcript.
TRANSCRIPT_SHARE: Final = 0.6
#: Seconds closing an abandoned summary stream may take after a cancel.
CLOSE_TIMEOUT: Final = 10.0
#: The ``source`` of a compaction summary.
COMPACTION_SOURCE: Final = "compaction"

SUMMARY_PROMPT: Final = (
    "You are compacting the history of a conversation between a user and an AI agent so the "
    "agent can continue the work with a shorter context. Write a faithful, self-contained "
    "summary of the transcript you are given: the user's goals and requests, decisions made, "
    "facts learned (file names, values, errors), tool calls that mattered and their outcomes, "
    "and what was still open. Write it as notes for the agent itself; do not address the user."
)
SUMMARY_HEADER: Final = "[Summary of the earlier conversation]\n"


@final
class CompactionError(AgentLoopError):
    """A compaction could not be made (the summary call failed or returned no text)."""

    code = "COMPACTION_FAILED"


# -- compaction ---------------------------------------------------------------------------
def _turn_starts(agent: TurnContext) -> list[int]:
    return [int(e.seq or 0) for e in agent.log.events if e.type == TURN_START]


def _kept_from(agent: TurnContext, start: int, keep: int) -> int:
    """The surface position where the last ``keep`` turns begin (the end when ``keep`` is 0)."""
    entries = agent.log.surface.entries
    if not keep:
        return len(entries)
    starts = _turn_starts(agent)
    if len(starts) < keep:
        return start  # fewer turns than kept: nothing is old enough
    boundary = starts[-keep]
    for k in range(start, len(entries)):
        event = entries[k]
        op = event.surface_op
        if (op is None or op == "append") and int(event.seq or 0) >= boundary:
            return k
    return len(entries)


def plan(agent: TurnContext, keep: int) -> tuple[int, int] | None:
    """Surface positions ``(i, j)`` to compact keeping ``keep`` turns, or None (nothing to)."""
    surface = agent.log.surface
    entries = surface.entries
    nodes = surface.system_nodes
    start = 0
    if nodes:
        start = next(k for k, e in enumerate(entries) if e is nodes[0]) + 1
    end = closed_end(entries, start, _kept_from(agent, start, keep))
    if end < start:
        return None
    covered = entries[start : end + 1]
    if all(_is_summary(e) or _is_empty_system(e) for e in covered):
        return None  # only an earlier summary: summarising it again gains nothing
    return start, end


def _is_summary(event: Event) -> bool:
    return event.type == USER_MESSAGE and event.data["message"].get("source") == COMPACTION_SOURCE


def _is_empty_system(event: Event) -> bool:
    return event.type == SYSTEM_MESSAGE and not event.data["message"].get("content")


def transcript(messages: Sequence[Mapping[str, Any]], limit: int | None) -> str:
    """The messages as plain text for the summary request (middle cut past ``limit`` chars)."""
    lines = []
    for message in messages:
        role = message.get("role", "?")
        for block in message.get("content", ()):
            kind = block.get("type")
            if kind == "text":
                lines.append(f"{role}: {block.get('text', '')}")
            elif kind == "reasoning":
                continue  # the agent's private reasoning is not part of the record
            elif kind == "tool-call":
                args = block.get("arguments")
                shown = args if isinstance(args, str) else repr(dict(args or {}))
                lines.append(f"{role} called tool {block.get('name')}({shown})")
            elif kind == "tool-result":
                lines.append(f"tool {block.get('name', '')} returned: {block.get('text', '')}")
    text = "\n".join(lines)
    if limit is not None and len(text) > limit:
        head = limit // 3
        tail = limit - head
        cut = len(text) - head - tail
        text = f"{text[:head]}\n[... {cut} characters omitted ...]\n{text[-tail:]}"
    return text


async def _route(agent: TurnContext) -> PreparedCall:
    header = agent.log.state.header
    if header is not None:
        config: Mapping[str, Any] = header["config"]
    else:
        opts = agent.options
        config = {
            k: v
            for k, v in {"provider": opts.provider, "model": opts.model}.items()
            if v is not None
        }
    try:
        return await agent.services.router.prepare_call(config)
    except ModelError as exc:
        raise CompactionError(f"no route for the summary: {exc.failure.message}") from None


@final
@attrs.define
class SummaryCall:
    """The route and usage of one default summary call, filled in as the call goes."""

    provider: str | None = None
    model: str | None = None
    usage: Usage | None = None
    made: bool = False
    """Whether the call was sent (a route was found)."""

    def to_data(self) -> dict[str, Any]:
        """``{provider?, model?, usage?}`` for the ``context/compaction`` record."""
        out: dict[str, Any] = {"provider": self.provider, "model": self.model}
        out = {k: v for k, v in out.items() if v is not None}
        if self.usage is not None:
            out["usage"] = self.usage.to_data()
        return out


async def default_summary(
    agent: TurnContext,
    messages: Sequence[Mapping[str, Any]],
    instructions: str | None,
    call: SummaryCall | None = None,
) -> str:
    """One model call on the agent's own route that summarises ``messages``.

    ``call``, when given, receives the route and the usage the provider reported.
    """
    call = call if call is not None else SummaryCall()
    prepared = await _route(agent)
    window = prepared.context_window
    limit = int(window * TRANSCRIPT_SHARE * CHARS_PER_TOKEN) if window else None
    ask = "Summarise this conversation transcript:\n\n" + transcript(messages, limit)
    if instructions:
        ask += f"\n\nInstructions for the summary: {instructions}"
    request = make_request(
        prepared.config,
        (
            FrozenDict(role="system", content=(FrozenDict(type="text", text=SUMMARY_PROMPT),)),
            FrozenDict(role="user", content=(FrozenDict(type="text", text=ask),)),
        ),
        (),
    )
    parts: list[str] = []
    call.provider = _text(prepared.config.get("provider"))
    call.model = _text(prepared.config.get("model"))
    call.made = True
    stream = prepared.stream_fn(request)
    try:
        async for chunk in stream:
            if type(chunk) is TextDelta:
                parts.append(chunk.text)
            elif type(chunk) is UsageChunk:
                call.usage = chunk.usage
            elif type(chunk) is Finish and chunk.reason in ("error", "aborted"):
                failure = chunk.failure
                raise CompactionError(
                    f"the summary call failed: {failure.message if failure else chunk.reason}"
                )
    except ModelError as exc:
        raise CompactionError(f"the summary call failed: {exc.failure.message}") from None
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await aclose()
    return "".join(parts)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@final
@attrs.frozen
class Compacted:
    """What one compaction replaced (the ``context/compacted`` notification's data)."""

    start_seq: int
    end_seq: int
    tokens_before: int
    tokens_after: int
    seq: int
    """Seq of the summary event."""


async def compact(
    agent: TurnContext,
    policy: CompactionPolicy,
    *,
    instructions: str | None = None,
    pending: Sequence[FrozenDict] = (),
    schemas: Sequence[Mapping[str, Any]] | None = None,
) -> Compacted | None:
    """Summarise the older surface and replace it; None when there is nothing to compact.

    Keeps ``policy.keep_recent_turns`` turns, fewer when nothing older is left.

    Raises:
        CompactionError: the summary could not be made.
    """
    planned = None
    for keep in range(policy.keep_recent_turns, -1, -1):
        planned = plan(agent, keep)
        if planned is not None:
            break
    if planned is None:
        return None
    i, j = planned
    entries = agent.log.surface.entries
    start_seq, end_seq = int(entries[i].seq or 0), int(entries[j].seq or 0)
    covered = [e.data["message"] for e in entries[i : j + 1] if not _is_empty_system(e)]
    before = count_tokens(agent, policy, pending, schemas)
    asked = instructions if instructions is not None else policy.instructions
    call = SummaryCall() if policy.summarizer is None else None
    record: dict[str, Any] = {"start_seq": start_seq, "end_seq": end_seq, "tokens_before": before}
    try:
        event = await _summarise(agent, policy, covered, asked, call, start_seq, end_seq)
    except CompactionError as exc:
        if call is not None and call.made:  # the call cost tokens: the log says so
            failure = {"code": exc.code, "message": str(exc)}
            _record(agent, {**record, "call": call.to_data(), "failure": failure})
        raise
    after = count_tokens(agent, policy, pending, schemas)
    result = Compacted(start_seq, end_seq, before, after, int(event.seq or 0))
    record.update(summary_seq=result.seq, tokens_after=after)
    if call is not None:
        record["call"] = call.to_data()
    _record(agent, record)
    agent.notify(
        CONTEXT_COMPACTED,
        {
            "start_seq": start_seq,
            "end_seq": end_seq,
            "tokens_before": before,
            "tokens_after": after,
            "seq": result.seq,
        },
    )
    return result


async def _summarise(
    agent: TurnContext,
    policy: CompactionPolicy,
    covered: Sequence[Mapping[str, Any]],
    asked: str | None,
    call: SummaryCall | None,
    start_seq: int,
    end_seq: int,
) -> Event:
    """Make the summary and append it over ``start_seq..end_seq``; the summary event."""
    if policy.summarizer is not None:
        try:
            text = await policy.summarizer(covered, asked)
        except CompactionError:
            raise
        except Exception as exc:
            raise CompactionError(f"the summarizer raised {type(exc).__name__}: {exc}") from exc
    else:
        text = await default_summary(agent, covered, asked, call)
    if not isinstance(text, str) or not text.strip():
        raise CompactionError("the summary is empty")
    next_id = f"m-{agent.log.inbox.max_id + 1}"
    data = FrozenDict(
        message=user_message(next_id, SUMMARY_HEADER + text.strip(), source=COMPACTION_SOURCE)
    )
    try:
        return append_replacement(agent, start_seq, end_seq, USER_MESSAGE, data)
    except InvalidOptionError as exc:  # the surface moved during the summary call
        raise CompactionError(f"the history changed during compaction: {exc}") from None


def _record(agent: TurnContext, data: Mapping[str, Any]) -> None:
    """Append the ``context/compaction`` record (ignorable: older readers skip it)."""
    frozen: FrozenDict = freeze(data)
    agent.log.append(make_event(CONTEXT_COMPACTION, None, 0.0, frozen, ignorable=True))


async def before_request(
    agent: TurnContext, turn: StepState, prepared: PreparedCall, policy: CompactionPolicy
) -> None:
    """Compact before the step's request when its estimate reaches the trigger."""
    window = prepared.context_window
    if not window:
        return
    tokens = count_tokens(agent, policy, turn.pending_users, turn.schemas)
    if tokens < policy.trigger_ratio * window:
        return
    try:
        await compact(agent, policy, pending=turn.pending_users, schemas=turn.schemas)
    except CompactionError as exc:  # the step goes on uncompacted; the overflow path may retry
        agent.notify(
            AGENT_ERROR,
            {
                "turn": turn.number,
                "step": turn.step,
                "error": {"code": exc.code, "message": str(exc)},
            },
        )


async def after_overflow(agent: TurnContext, turn: StepState, policy: CompactionPolicy) -> bool:
    """Compact after a ``CONTEXT_OVERFLOW`` failure; True when the step may be retried."""
    try:
        done = await compact(agent, policy, pending=turn.pending_users, schemas=turn.schemas)
    except CompactionError:
        return False
    return done is not None


async def compact_now(agent: TurnContext, instructions: str | None) -> Compacted | None:
    """``agent.compact()``: compact between turns with the agent's policy (or the defaults).

    Raises:
        InvalidOptionError: a turn is running (compaction then happens before its steps).
        CompactionError: the summary could not be made.
    """
    if agent.running_turn is not None:
        raise InvalidOptionError(
            "compact() runs between turns; during a turn the compaction policy decides"
        )
    if agent.closed:
        raise AgentClosedError(f"agent {agent.id!r} is disposed")
    return await compact(agent, agent.compaction or CompactionPolicy(), instructions=instructions)
