"""``POST /agui``: one AG-UI run, a user message or answers to interrupts in, a turn out.

See docs/design.md#ag-ui. The request is an AG-UI ``RunAgentInput``; ``threadId`` is the session
id. The reply is a Server-Sent Events stream of AG-UI events, translated from the committed log
(``agui_translate``): ``RUN_STARTED`` (echoing ``parentRunId``), the run's turn, its terminal
event.

A run without ``resume`` entries sends the text of its last ``user`` message to the session (an
unknown one is created, of ``forwardedProps.agent`` or the default agent) with a message id
derived from ``runId``, so a retried POST of the same run is the same message and streams the
same turn again: the turn that claimed the message. A message sent while calls of the session
wait for a decision would wait behind them, so, as ``FleetClient.run`` does, nothing is sent: the
run finishes at once with their interrupts. A run without a user message (or whose last one has
no text) is ``RUN_STARTED`` then ``RUN_ERROR`` ``NO_USER_MESSAGE``/``NO_USER_TEXT``, and nothing
is sent or created.

A run with ``resume`` entries answers the interrupts of the session's calls waiting for approval
(interrupt id = call id) and streams their continuation, the next turn (``Continuation``):

- an entry decides its call: ``status: cancelled`` denies it; ``resolved`` approves or denies it
  as its ``payload`` says: ``true``, ``{"approved": true}`` or ``{"decision": "approve"}``
  approve (``"always": true`` adds the allow rule ``approve(always=True)`` records); ``false``,
  ``{"approved": false}`` or ``{"decision": "deny"}`` deny, with the payload's ``message`` if any.
  A payload that says neither, entries naming one call twice, or more than ``MAX_RESUME``
  entries are 400 ``BAD_REQUEST``; a denial's message over the fleet's limit 413;
- every entry is checked against the log's waiting calls first: one naming a call that is not
  waiting is ``RUN_ERROR`` ``NOT_AWAITING_APPROVAL`` and nothing is decided (a retried resuming
  run finds its calls decided and ends so too: the log has the continuation);
- a resuming run answers interrupts only: when its last message is a user message (a new one: a
  resuming input carries the thread's messages so far, ending with the interrupted run's own), it
  is ``RUN_ERROR`` ``RESUME_WITH_MESSAGE`` and nothing is decided or sent. Send the message in a
  run of its own once the continuation finished;
- the decisions are queued as fleet commands (not waited for: the continuation turn starts only
  once a worker applied them, and the stream follows the log until it does, as a message no
  worker runs yet). The agent starts no turn while a call waits, so when calls are left
  unanswered the run finishes at once with their interrupts (the answered ones stay decided).

Nothing is decided or sent before the whole input was checked. A comment line ``: keepalive``
goes out after ``KEEPALIVE`` seconds of quiet (a turn no worker starts keeps the stream open); a
client that goes away stops the following (Starlette cancels the generator) and nothing else:
the turn goes on in its worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from typing import Any, Final, final

import attrs
import trio
from ag_ui.core import BaseEvent, ResumeEntry, RunAgentInput, TextPart, UserMessage
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .._errors import (
    AgentLoopError,
    InvalidOptionError,
    SessionAlreadyExistsError,
)
from .._fleet.client import MAX_MESSAGE_BYTES
from ..events import Event
from .agui_translate import Continuation, RunTranslator, agui_message_id
from .context import ServeContext
from .replies import ApiError, bad, read_body
from .stream import check_room, counted

__all__ = ["AguiRequest", "Decision", "agui_endpoint", "agui_stream", "parse_request"]

#: Seconds of quiet between keepalive comments.
KEEPALIVE: Final = 15.0
#: Seconds between looks at the store for the turn's next events.
POLL: Final = 0.05
#: Longest ``threadId`` (a session id) and ``parentRunId``, and ``runId`` (its message id adds
#: ``agui-``).
MAX_THREAD_ID: Final = 200
MAX_RUN_ID: Final = 195
#: Most ``resume`` entries one run may carry.
MAX_RESUME: Final = 1000
#: Longest error message a ``RUN_ERROR`` carries.
MAX_ERROR_TEXT: Final = 2000
_PAYLOADS: Final = (
    'approve (true, {"approved": true} or {"decision": "approve"}) or deny (false,'
    ' {"approved": false} or {"decision": "deny"})'
)


@final
@attrs.frozen
class Decision:
    """What one ``resume`` entry decides."""

    call_id: str
    """The interrupt's id: the waiting call's."""
    approve: bool
    message: str | None = None
    """A denial's message."""
    always: bool = False
    """An approval that also records an allow rule."""


@final
@attrs.frozen
class AguiRequest:
    """What a ``RunAgentInput`` asks for."""

    thread_id: str
    run_id: str
    text: str | None
    """The user message to send ("" when it has no text); None: none.

    Without ``resume``: the last user message. With it: the last message when it is a user one.
    """
    agent: str | None
    """``forwardedProps.agent``: the agent of a new session (None: the default)."""
    resume: tuple[Decision, ...] = ()
    parent_run_id: str | None = None


def parse_request(raw: bytes) -> AguiRequest:
    """Read a ``RunAgentInput`` body.

    Raises:
        ApiError: 400 ``BAD_REQUEST`` naming what is wrong; 413 for a denial's message the fleet
            would refuse.
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object (an AG-UI RunAgentInput)")
    try:
        run = RunAgentInput.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise bad(f"not an AG-UI RunAgentInput: {where}: {first['msg']}"[:500]) from None
    if not 0 < len(run.thread_id) <= MAX_THREAD_ID:
        raise bad(f"threadId must be 1..{MAX_THREAD_ID} characters")
    if not 0 < len(run.run_id) <= MAX_RUN_ID:
        raise bad(f"runId must be 1..{MAX_RUN_ID} characters")
    if run.parent_run_id is not None and len(run.parent_run_id) > MAX_THREAD_ID:
        raise bad(f"parentRunId must be at most {MAX_THREAD_ID} characters")
    props = run.forwarded_props
    agent = props.get("agent") if isinstance(props, dict) else None
    resume = _decisions(run.resume or ())
    last = run.messages[-1:] if resume else run.messages
    return AguiRequest(
        thread_id=run.thread_id,
        run_id=run.run_id,
        text=_last_user_text(last),
        agent=agent if isinstance(agent, str) else None,
        resume=resume,
        parent_run_id=run.parent_run_id,
    )


def _last_user_text(messages: Iterable[Any]) -> str | None:
    for message in reversed(list(messages)):
        if isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                return content
            return "\n".join(part.text for part in content if isinstance(part, TextPart))
    return None


def _decisions(entries: Sequence[ResumeEntry]) -> tuple[Decision, ...]:
    """The ``resume`` entries' decisions (module docstring).

    Raises:
        ApiError: 400 ``BAD_REQUEST``, 413 ``LIMIT_EXCEEDED`` (a denial's message).
    """
    if len(entries) > MAX_RESUME:
        raise bad(f"resume has {len(entries)} entries, over {MAX_RESUME}")
    decisions = tuple(_decision(f"resume[{i}]", entry) for i, entry in enumerate(entries))
    ids = [d.call_id for d in decisions]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise bad(f"resume answers an interrupt more than once: {twice}"[:500])
    return decisions


def _decision(where: str, entry: ResumeEntry) -> Decision:
    payload = entry.payload
    options = payload if isinstance(payload, dict) else {}
    message, always = options.get("message"), options.get("always", False)
    if message is not None and not isinstance(message, str):
        raise bad(f"{where}.payload.message must be a string")
    if not isinstance(always, bool):
        raise bad(f"{where}.payload.always must be a boolean")
    approve = False if entry.status == "cancelled" else _approves(where, payload)
    if approve:
        return Decision(entry.interrupt_id, True, always=always)
    if message is not None:
        _check_size(f"{where}'s message", {"call_id": entry.interrupt_id, "message": message})
    return Decision(entry.interrupt_id, False, message)


def _approves(where: str, payload: Any) -> bool:
    """Whether a ``resolved`` entry's payload approves (else it denies).

    Raises:
        ApiError: 400 when it says neither, or both.
    """
    if isinstance(payload, bool):
        return payload
    says: set[bool] = set()
    if isinstance(payload, dict):
        approved, decision = payload.get("approved"), payload.get("decision")
        if isinstance(approved, bool):
            says.add(approved)
        elif approved is not None:
            raise bad(f"{where}.payload.approved must be a boolean")
        if decision in ("approve", "deny"):
            says.add(decision == "approve")
        elif decision is not None:
            raise bad(f"{where}.payload.decision must be 'approve' or 'deny'")
    if len(says) != 1:
        why = "says both" if says else "must"
        raise bad(f"{where}.payload {why} {_PAYLOADS}")
    return says.pop()


def _check_size(what: str, record: dict[str, Any]) -> None:
    """Refuse, before anything is created or decided, what the fleet would refuse.

    Raises:
        ApiError: 413 ``LIMIT_EXCEEDED``.
    """
    size = len(json.dumps(record, ensure_ascii=False).encode())
    if size > MAX_MESSAGE_BYTES:
        raise ApiError(
            413, "LIMIT_EXCEEDED", f"{what} of {size} bytes is over the fleet's {MAX_MESSAGE_BYTES}"
        )


async def _open_thread(ctx: ServeContext, run: AguiRequest) -> list[Event]:
    """Create the thread's session when nobody knows it; its stored events.

    Raises:
        ApiError: 400 for an unknown agent.
    """
    if not await ctx.client.known(run.thread_id):
        try:
            await ctx.create_session(run.agent, run.thread_id)
        except SessionAlreadyExistsError:
            pass  # a racing POST created it
        except InvalidOptionError as exc:
            raise bad(str(exc)) from None
    return await ctx.client.stored(run.thread_id)


async def agui_stream(
    head: Iterable[BaseEvent],
    translator: RunTranslator,
    tail: AsyncIterator[Event] | None,
    *,
    keepalive: float = KEEPALIVE,
) -> AsyncGenerator[str, None]:
    """The SSE text of a run: ``head``, then what ``translator`` makes of ``tail``'s events.

    Stops after the run's terminal event; a keepalive comment after ``keepalive`` quiet seconds.
    """
    encoder = EventEncoder()
    for event in head:
        yield encoder.encode(event)
    if tail is None:
        return
    while not translator.done:
        failure: AgentLoopError | None = None
        with trio.move_on_after(keepalive) as quiet:
            try:
                logged = await tail.__anext__()
            except AgentLoopError as exc:  # the store failed: say so and stop
                failure = exc
        if failure is not None:
            for out in translator.fail(failure.code, str(failure), time.time()):
                yield encoder.encode(out)
            return
        if quiet.cancelled_caught:
            yield ": keepalive\n\n"
            continue
        for out in translator.feed(logged):
            yield encoder.encode(out)


_Run = tuple[list[BaseEvent], RunTranslator, AsyncIterator[Event] | None]
"""What a run streams: the events known at once, their translator, the log's tail to follow."""


async def _send_run(ctx: ServeContext, run: AguiRequest) -> _Run:
    """A run that sends its last user message (module docstring)."""
    message_id = agui_message_id(run.run_id)
    translator = RunTranslator(run.thread_id, run.run_id, message_id)
    head = translator.start(time.time(), run.parent_run_id)
    if not run.text:
        code = "NO_USER_MESSAGE" if run.text is None else "NO_USER_TEXT"
        why = "no user message" if run.text is None else "a last user message without text"
        head += translator.fail(code, f"the input has {why}: nothing to send", time.time())
        return head, translator, None
    _check_size("message", {"message_id": message_id, "content": run.text})
    stored = await _open_thread(ctx, run)
    for event in stored:
        head += translator.feed(event)
    if translator.done:  # a retried run whose turn ended: replayed
        return head, translator, None
    refused = translator.refuse_behind_approvals(time.time())
    if refused:
        return head + refused, translator, None
    await ctx.client.send(run.thread_id, run.text, message_id=message_id)
    tail = ctx.client.events(run.thread_id, after_seq=len(stored) - 1, poll_interval=POLL)
    return head, translator, tail


async def _resume_run(ctx: ServeContext, run: AguiRequest) -> _Run:
    """A run that answers interrupts and streams their continuation (module docstring)."""
    stored = await ctx.client.stored(run.thread_id)
    after = len(stored) - 1
    answered = [d.call_id for d in run.resume]
    translator = RunTranslator(run.thread_id, run.run_id, Continuation(answered, after))
    head = translator.start(time.time(), run.parent_run_id)
    if run.text is not None:
        why = (
            "a resuming run answers interrupts only, and its last message is a new user message:"
            " nothing was decided or sent; send the message in a run of its own once the"
            " continuation finished"
        )
        return head + translator.fail("RESUME_WITH_MESSAGE", why, time.time()), translator, None
    for event in stored:
        head += translator.feed(event)  # nothing: the continuation comes after ``after``
    waiting = translator.waiting()
    stale = [call_id for call_id in answered if call_id not in waiting]
    if stale:
        why = (
            f"not waiting for a decision in session {run.thread_id!r}: {', '.join(stale)}"
            f" (waiting: {', '.join(waiting) or 'none'}); nothing was decided"
        )[:MAX_ERROR_TEXT]
        return head + translator.fail("NOT_AWAITING_APPROVAL", why, time.time()), translator, None
    for decision in run.resume:
        if decision.approve:
            await ctx.client.approve(
                run.thread_id, decision.call_id, always=decision.always, wait=False
            )
        else:
            await ctx.client.deny(run.thread_id, decision.call_id, decision.message, wait=False)
    unanswered = [call_id for call_id in waiting if call_id not in answered]
    if unanswered:
        return head + translator.interrupt(unanswered, time.time()), translator, None
    tail = ctx.client.events(run.thread_id, after_seq=after, poll_interval=POLL)
    return head, translator, tail


async def agui_endpoint(request: Request) -> Response:
    """``POST /agui`` (module docstring).

    Raises:
        ApiError: 400 for a bad body or agent, 413 for a body, message or denial too large,
            503 when the server has as many event streams open as it allows.
        AgentLoopError: the store failed (``app.py`` replies 503).
    """
    ctx: ServeContext = request.app.state.ctx
    run = parse_request(await read_body(request))
    check_room(request)
    head, translator, tail = await (_resume_run if run.resume else _send_run)(ctx, run)
    headers = {"cache-control": "no-store", "x-accel-buffering": "no"}
    return StreamingResponse(
        counted(request, agui_stream(head, translator, tail)),
        media_type=EventEncoder().get_content_type(),
        headers=headers,
    )
