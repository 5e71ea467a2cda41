"""OpenTelemetry traces of turns, model attempts and tool calls (GenAI semantic conventions).

Tracing is an observer of the hook bus, never a step of the turn machine: ``trace_runtime``
registers ``on`` observers of ``session/event`` (every committed durable event, in log order),
of ``agent/attempt-start`` and the inbox notifications (published only while someone listens)
and of ``agent/disposed`` on the runtime's bus. A runtime without tracing registers nothing, so
its agents pay nothing; importing ``dsh_agent_loop`` never imports this module (``open_runtime``
imports it only when tracing is asked for), so a plain install needs no ``opentelemetry``.

The span tree follows the log, not the tasks: ``invoke_agent {agent}`` spans ``turn/start`` to
``turn/end``; ``chat {model}`` spans one model attempt, from its ``agent/attempt-start`` (so a
retried attempt's span does not include the backoff before it) to its ``assistant/message`` or
``assistant/attempt``; ``execute_tool {tool}`` spans ``tool/call`` to ``tool/result``. Events
reach observers only after their commit (an attempt's start is live, so it is kept by position
until its end commits), so every span is started and ended with explicit timestamps taken from
``Event.time`` (the runtime's clock, mapped onto the epoch when it is not the wall clock) and an
explicit parent context: no context variable crosses a trio task. A turn's span is a child of the
span that was active where its prompt was queued (``agent.run``, ``send``, ``followup``: the
caller's task, where ``agent/inbox/inserted`` is published), so it joins the caller's trace;
a prompt queued with no span active starts a trace of its own. The provider's
``response: {model?, id?}`` of an ``assistant/message`` becomes ``gen_ai.response.model`` and
``gen_ai.response.id``. A turn
whose ``turn/end`` never commits (its agent was disposed after a store failure) has its spans
ended, with an error status, when ``agent/disposed`` arrives.

Content stays out unless ``capture_content`` asks for it: a tool's result text, a tool error's
message (which often embeds the tool's output), a provider's error message (which may quote its
response body) and an abort's message reach no attribute and no status description; a failed
span carries its code (``error.type``, and the code alone as the status description), and
only descriptions this module writes itself (``cancelled (user)``) are added to it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from ._agent.agent import actor_of
from ._frozen import thaw
from ._hooks import Disposer
from .events import (
    AGENT_DISPOSED,
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    ATTEMPT_START,
    INBOX_CLAIMED,
    INBOX_DISCARDED,
    INBOX_INSERTED,
    REQUEST_CONTEXT,
    REQUEST_HEADER,
    SESSION_EVENT,
    STEP_START,
    SYSTEM_MESSAGE,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    Event,
)

if TYPE_CHECKING:
    from ._agent.lifecycle import Agents
    from ._hooks import HookBus

__all__ = ["trace_runtime"]

#: The instrumentation scope name of every span this module starts.
TRACER_NAME: Final = "dsh_agent_loop"
#: Our ``finish`` values → the GenAI conventions' finish reasons (others are passed as they are).
_FINISH_REASONS: Final = {"stop": "stop", "tool-calls": "tool_calls", "max-tokens": "length"}
#: ``turn/end`` reason kinds that are not failures.
_OK_KINDS: Final = frozenset({"completed", "max-tokens", "blocked", "awaiting-approval"})


class Runtime(Protocol):
    """What tracing needs of a runtime (``open_runtime``'s): its agents, hooks and clock."""

    @property
    def agents(self) -> Agents:
        """The live agents (for an agent's options and log)."""
        ...

    @property
    def hooks(self) -> HookBus:
        """The bus the observers are registered on."""
        ...

    @property
    def clock(self) -> Callable[[], float]:
        """The runtime's clock (seconds)."""
        ...


def _wall_offset(clock: Callable[[], float]) -> int:
    """Nanoseconds to add to ``clock() * 1e9`` to land on the epoch."""
    if clock is time.time:
        return 0
    return time.time_ns() - int(clock() * 1e9)


def _set_error(span: Span, code: str, message: str) -> None:
    span.set_attribute("error.type", code)
    span.set_status(Status(StatusCode.ERROR, _describe(code, message)))


def _describe(code: str, message: str) -> str:
    return f"{code}: {message}" if message else code


def _part(block: Mapping[str, Any]) -> dict[str, Any]:
    """One content block in the GenAI conventions' message-part shape."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": block.get("text", "")}
    if kind == "reasoning":
        return {"type": "reasoning", "content": block.get("text", "")}
    if kind == "tool-call":
        return {
            "type": "tool_call",
            "id": block.get("call_id"),
            "name": block.get("name"),
            "arguments": block.get("arguments"),
        }
    if kind == "tool-result":
        return {
            "type": "tool_call_response",
            "id": block.get("call_id"),
            "response": block.get("text"),
        }
    return {"type": str(kind), **thaw(block)}


def _messages_json(messages: Iterable[Mapping[str, Any]]) -> str:
    out = [
        {"role": m.get("role"), "parts": [_part(b) for b in m.get("content", ())]} for m in messages
    ]
    return json.dumps(out, ensure_ascii=False, default=str)


@final
class _TurnTrace:
    """The open spans of one turn."""

    __slots__ = ("attempt_start", "context", "input_tokens", "output_tokens", "span", "tools")

    def __init__(self, span: Span, start: int) -> None:
        self.span = span
        self.context = trace.set_span_in_context(span, otel_context.Context())
        self.attempt_start = start
        """When the next model attempt began (nanoseconds since the epoch)."""
        self.input_tokens = 0
        self.output_tokens = 0
        self.tools: dict[str, Span] = {}
        """Open ``execute_tool`` spans by call id."""


@final
class _SessionTrace:
    """What one traced session remembers between its events."""

    __slots__ = ("agent_id", "model", "provider", "session_id", "turn")

    def __init__(self, agent_id: str, session_id: str) -> None:
        self.agent_id = agent_id
        self.session_id = session_id
        self.provider: str | None = None
        self.model: str | None = None
        self.turn: _TurnTrace | None = None


@final
class _Tracing:
    """Turns committed events into spans (one per runtime)."""

    def __init__(self, rt: Runtime, tracer: Tracer, capture_content: bool) -> None:
        self._rt = rt
        self._tracer = tracer
        self._capture = capture_content
        self._offset = _wall_offset(rt.clock)
        self._sessions: dict[str, _SessionTrace] = {}
        self._attempt_starts: dict[str, dict[tuple[int, int, int], int]] = {}
        """Agent id → (turn, step, attempt) → when that attempt began, until its span is made."""
        self._callers: dict[tuple[str, str], otel_context.Context] = {}
        """(agent id, message id) → the context a queued prompt was sent from, with a span."""
        self._parents: dict[tuple[str, int], otel_context.Context] = {}
        """(agent id, turn) → the caller's context of a prompt that turn claimed."""
        self._handlers: dict[str, Callable[[_SessionTrace, Event], None]] = {
            TURN_START: self._turn_start,
            TURN_END: self._turn_end,
            STEP_START: self._step_start,
            REQUEST_HEADER: self._request_header,
            REQUEST_CONTEXT: self._request_context,
            ASSISTANT_MESSAGE: self._assistant_message,
            ASSISTANT_ATTEMPT: self._assistant_attempt,
            TOOL_CALL: self._tool_call,
            TOOL_RESULT: self._tool_result,
        }

    def _ns(self, event: Event) -> int:
        return int(event.time * 1e9) + self._offset

    def _content(self, message: str) -> str:
        """``message`` (from the log: a tool's or a provider's words) if content is captured."""
        return message if self._capture else ""

    # -- observers ---------------------------------------------------------------------------
    def on_session_event(self, note: Event) -> None:
        """``session/event``: one committed event of some agent's log."""
        event: Event = note.data["event"]
        handler = self._handlers.get(event.type)
        if handler is None:
            return
        session_id = note.data["session_id"]
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = self._new_session(
                note.data["agent_id"], session_id
            )
        handler(session, event)

    def on_attempt_start(self, note: Event) -> None:
        """``agent/attempt-start``: remember when the attempt began (its end commits later)."""
        data = note.data
        starts = self._attempt_starts.get(data["agent_id"])
        if starts is None:
            starts = self._attempt_starts[data["agent_id"]] = {}
        starts[data["turn"], data["step"], data["attempt"]] = self._ns(note)

    def on_inbox_inserted(self, note: Event) -> None:
        """``agent/inbox/inserted``, in the sender's task: keep its context if a span is active."""
        caller = otel_context.get_current()
        if trace.get_current_span(caller).get_span_context().is_valid:
            self._callers[note.data["agent_id"], note.data["message"]["id"]] = caller

    def on_inbox_claimed(self, note: Event) -> None:
        """``agent/inbox/claimed``: the claiming turn's span will be a child of the sender's."""
        agent_id = note.data["agent_id"]
        caller = self._callers.pop((agent_id, note.data["message"]["id"]), None)
        agent = self._rt.agents.get(agent_id)
        if caller is None or agent is None:
            return
        state = actor_of(agent).log.state
        if state.open_turn:  # claimed by a turn (a removal between turns is a claim too)
            # as the turn starts: its turn/start is added and not yet committed, so not traced
            self._parents[agent_id, state.turn] = caller

    def on_inbox_discarded(self, note: Event) -> None:
        """``agent/inbox/discarded``: a prompt no turn will claim."""
        self._callers.pop((note.data["agent_id"], note.data["message"]["id"]), None)

    def on_agent_disposed(self, note: Event) -> None:
        """``agent/disposed``: end what the agent left open (a ``turn/end`` that never came)."""
        agent_id = note.data["agent_id"]
        self._attempt_starts.pop(agent_id, None)
        for caller in [k for k in self._callers if k[0] == agent_id]:
            del self._callers[caller]
        for parent in [k for k in self._parents if k[0] == agent_id]:
            del self._parents[parent]
        session = self._sessions.pop(note.data["session_id"], None)
        if session is not None and session.turn is not None:
            self._close_turn(session.turn, None, "DISPOSED", "the agent was disposed mid-turn")
            session.turn = None

    def _new_session(self, agent_id: str, session_id: str) -> _SessionTrace:
        session = _SessionTrace(agent_id, session_id)
        agent = self._rt.agents.get(agent_id)
        if agent is not None:  # until the log names them (a resumed log's are not re-sent)
            session.provider = agent.options.provider
            session.model = agent.options.model
        return session

    # -- turns -------------------------------------------------------------------------------
    def _turn_start(self, session: _SessionTrace, event: Event) -> None:
        if session.turn is not None:  # never expected: the log pairs them
            self._close_turn(session.turn, None, "INTERRUPTED", "a new turn started")
        start = self._ns(event)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": session.agent_id,
            "gen_ai.conversation.id": session.session_id,
        }
        self._model_attributes(session, attributes)
        caller = self._parents.pop((session.agent_id, event.data["turn"]), None)
        span = self._tracer.start_span(
            f"invoke_agent {session.agent_id}",
            # the caller's span, captured where the prompt was queued; else a root
            context=caller if caller is not None else otel_context.Context(),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
        )
        session.turn = _TurnTrace(span, start)

    def _turn_end(self, session: _SessionTrace, event: Event) -> None:
        turn, session.turn = session.turn, None
        self._parents.pop((session.agent_id, event.data["turn"]), None)  # a claim mid-turn
        starts = self._attempt_starts.get(session.agent_id)
        if starts:  # attempts cancelled before they recorded anything
            number = event.data["turn"]
            for key in [k for k in starts if k[0] == number]:
                del starts[key]
        if turn is None:
            return
        reason = event.data.get("reason") or {}
        kind = str(reason.get("kind", "completed"))
        turn.span.set_attribute("dsh_agent_loop.turn.end", kind)
        if kind in _OK_KINDS:
            self._close_turn(turn, self._ns(event))
        elif kind == "error":
            error = reason.get("error") or {}
            code, message = str(error.get("code", "ERROR")), str(error.get("message", ""))
            self._close_turn(turn, self._ns(event), code, self._content(message))
        elif kind == "aborted":
            cause = reason.get("cause", "user")
            message = self._content(str(reason.get("message") or "")) or f"cancelled ({cause})"
            self._close_turn(turn, self._ns(event), "ABORTED", message)
        else:
            self._close_turn(turn, self._ns(event), kind.upper(), f"turn ended {kind}")

    def _close_turn(
        self, turn: _TurnTrace, end: int | None, code: str | None = None, message: str = ""
    ) -> None:
        for span in turn.tools.values():  # calls deferred for approval, or a turn cut short
            if code is not None:
                _set_error(span, code, message)
            span.end(end)
        turn.tools.clear()
        turn.span.set_attribute("gen_ai.usage.input_tokens", turn.input_tokens)
        turn.span.set_attribute("gen_ai.usage.output_tokens", turn.output_tokens)
        if code is not None:
            _set_error(turn.span, code, message)
        turn.span.end(end)

    def _step_start(self, session: _SessionTrace, event: Event) -> None:
        if session.turn is not None:
            session.turn.attempt_start = self._ns(event)

    def _request_header(self, session: _SessionTrace, event: Event) -> None:
        config = event.data["header"].get("config") or {}
        session.provider = config.get("provider", session.provider)
        session.model = config.get("model", session.model)

    def _request_context(self, session: _SessionTrace, event: Event) -> None:
        session.provider = event.data.get("provider", session.provider)
        session.model = event.data.get("model", session.model)

    @staticmethod
    def _model_attributes(session: _SessionTrace, attributes: dict[str, Any]) -> None:
        if session.provider is not None:
            attributes["gen_ai.provider.name"] = session.provider
        if session.model is not None:
            attributes["gen_ai.request.model"] = session.model

    # -- model attempts ----------------------------------------------------------------------
    def _chat(
        self,
        session: _SessionTrace,
        turn: _TurnTrace,
        event: Event,
        attributes: dict[str, Any],
        error: tuple[str, str] | None,
    ) -> None:
        """One finished attempt: its span is started and ended at once (it is all in the log)."""
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.conversation.id"] = session.session_id
        attributes["dsh_agent_loop.attempt"] = event.data["stream"].get("attempt", 1)
        self._model_attributes(session, attributes)
        if self._capture:
            attributes["gen_ai.input.messages"] = self._input_messages(session, event)
        if error is not None:
            attributes["error.type"] = error[0]
        end = self._ns(event)
        start = turn.attempt_start  # without its attempt-start: the step's start or last end
        starts = self._attempt_starts.get(session.agent_id)
        if starts:
            data = event.data
            start = starts.pop(
                (data["turn"], data["step"], data["stream"].get("attempt", 1)), start
            )
        span = self._tracer.start_span(
            f"chat {session.model}" if session.model else "chat",
            context=turn.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=start,
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, _describe(*error)))
        span.end(end)
        turn.attempt_start = end

    def _input_messages(self, session: _SessionTrace, event: Event) -> str:
        """The derived history the attempt sent: surface messages logged before ``event``."""
        agent = self._rt.agents.get(session.agent_id)
        if agent is None:
            return "[]"
        before = event.seq or 0
        messages = [
            e.data["message"]
            for e in actor_of(agent).log.surface.entries
            if e.seq is not None
            and e.seq < before
            and "message" in e.data
            and not (e.type == SYSTEM_MESSAGE and not e.data["message"].get("content"))
        ]
        return _messages_json(messages)

    def _assistant_message(self, session: _SessionTrace, event: Event) -> None:
        turn = session.turn
        if turn is None:
            return
        data = event.data
        finish = str(data["stream"].get("finish", ""))
        attributes: dict[str, Any] = {
            "gen_ai.response.finish_reasons": (_FINISH_REASONS.get(finish, finish),)
        }
        usage = data.get("usage")
        if usage is not None:
            attributes["gen_ai.usage.input_tokens"] = usage["input_tokens"]
            attributes["gen_ai.usage.output_tokens"] = usage["output_tokens"]
            turn.input_tokens += usage["input_tokens"]
            turn.output_tokens += usage["output_tokens"]
        response = data.get("response")
        if response is not None:
            if "model" in response:
                attributes["gen_ai.response.model"] = response["model"]
            if "id" in response:
                attributes["gen_ai.response.id"] = response["id"]
        if self._capture:
            attributes["gen_ai.output.messages"] = _messages_json((data["message"],))
        error = (
            ("ABORTED", "the attempt was cancelled mid-stream") if data.get("interrupted") else None
        )
        self._chat(session, turn, event, attributes, error)

    def _assistant_attempt(self, session: _SessionTrace, event: Event) -> None:
        turn = session.turn
        if turn is None:
            return
        failure = event.data.get("failure") or {}
        code = str(failure.get("code", "ERROR"))
        self._chat(session, turn, event, {}, (code, self._content(str(failure.get("message", "")))))

    # -- tool calls --------------------------------------------------------------------------
    def _tool_call(self, session: _SessionTrace, event: Event) -> None:
        turn = session.turn
        if turn is None:
            return
        data = event.data
        turn.tools[data["call_id"]] = span = self._tool_span(
            session, turn, data["name"], data["call_id"], self._ns(event)
        )
        if self._capture:
            span.set_attribute("gen_ai.tool.call.arguments", str(data["arguments"]))

    def _tool_span(
        self, session: _SessionTrace, turn: _TurnTrace, name: str, call_id: str, start: int
    ) -> Span:
        return self._tracer.start_span(
            f"execute_tool {name}",
            context=turn.context,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
                "gen_ai.conversation.id": session.session_id,
            },
            start_time=start,
        )

    def _tool_result(self, session: _SessionTrace, event: Event) -> None:
        turn = session.turn
        if turn is None:
            return
        data = event.data
        message = data["message"]
        end = self._ns(event)
        span = turn.tools.pop(message["call_id"], None)
        if span is None:  # a call approved between turns: its result comes in this turn
            span = self._tool_span(session, turn, message["name"], message["call_id"], end)
        error = data.get("error")
        text = "".join(b.get("text", "") for b in message["content"]) if self._capture else ""
        if error is not None:
            _set_error(span, str(error["code"]), text)  # the code alone unless content is kept
        if self._capture:
            span.set_attribute("gen_ai.tool.call.result", text)
        span.end(end)


def trace_runtime(
    rt: Runtime,
    tracer_provider: TracerProvider | None = None,
    *,
    capture_content: bool = False,
) -> Disposer:
    """Trace every agent of ``rt``: one span per turn, per model attempt and per tool call.

    ``open_runtime(tracer_provider=...)`` (or the config's ``otel`` key) calls this before any
    agent starts; calling it on a live runtime traces the turns that start afterwards.

    Args:
        rt: The runtime whose hook bus gets the observers.
        tracer_provider: Where spans go (default: the global provider, read now).
        capture_content: Record messages, tool arguments and results on the spans.

    Returns:
        A disposer that removes the observers (spans already open stay open).
    """
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    tracer = provider.get_tracer(TRACER_NAME)
    tracing = _Tracing(rt, tracer, capture_content)
    disposers = (
        rt.hooks.on(SESSION_EVENT, tracing.on_session_event),
        rt.hooks.on(ATTEMPT_START, tracing.on_attempt_start),
        rt.hooks.on(AGENT_DISPOSED, tracing.on_agent_disposed),
        rt.hooks.on(INBOX_INSERTED, tracing.on_inbox_inserted),
        rt.hooks.on(INBOX_CLAIMED, tracing.on_inbox_claimed),
        rt.hooks.on(INBOX_DISCARDED, tracing.on_inbox_discarded),
    )

    def dispose() -> None:
        for disposer in disposers:
            disposer()

    return dispose
