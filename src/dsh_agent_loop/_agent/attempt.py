"""``Attempt``: one model call of a step (docs/design.md#attempts).

An attempt proposes the request config (``agent/request``), prepares the call, then runs the
synchronous phase with no await in it (reconcile the prompt, admit the step's users, write the
request records, freeze the request) and streams. It ends in exactly one of: an
``assistant/message`` (returned), an ``assistant/attempt`` recording a failure (the failure is
returned, to be offered to ``agent/request-error``), or, when the turn is cancelled mid-stream,
whatever ``close`` appends: an interrupted ``assistant/message`` carrying exactly the delivered
prefix, or an ``assistant/attempt`` when nothing was delivered. Stream frames
(``agent/assistant-stream``) and ``agent/attempt-start`` are published only while someone
listens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, final

import trio
from msgspec import Struct

from .._frozen import FrozenDict
from .._session.records import (
    abandoned_attempt_data,
    assistant_message_data,
    attempt_failure_data,
    interrupted_message_data,
    response_data,
)
from .._tools.results import exception_text
from ..events import (
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    ASSISTANT_STREAM,
    ATTEMPT_START,
    HOOK_REQUEST,
    HOOK_REQUEST_ERROR,
)
from ..llm import (
    FOLD_CHUNK,
    Assembler,
    Failure,
    Finish,
    ModelError,
    ModelRequest,
    PreparedCall,
    make_request,
)
from .compaction import before_request
from .request import MAX_ATTEMPTS, PreStepDecision, Retry, default_retry_delay

if TYPE_CHECKING:
    from .._session.log import Session
    from ._turn_context import StepState, TurnContext

__all__ = ["CLOSE_STREAM_TIMEOUT", "Attempt", "unique_call_ids"]

#: Seconds closing an abandoned stream may take after a cancel.
CLOSE_STREAM_TIMEOUT: Final = 10.0
_NO_CONFIG: Final = FrozenDict()
_ABORTED: Final = FrozenDict(code="ABORTED", message="cancelled before anything was delivered")


@final
class Attempt(Struct, gc=False, eq=False):
    """One model call: its number, its config, and the stream in flight (if any).

    ``Attempt(turn, turn.agent, number)``. Not GC-tracked (a ``msgspec.Struct`` declared
    ``gc=False``): it lives as long as its model streams, which with thousands of agents
    mid-stream outlasts many collections of the young generations. It refers to its turn and
    agent, so the turn's own reference to it (``Turn.attempt``) is dropped when the turn closes
    its open work (``Turn.close_open_work``): no cycle runs through it after that.
    """

    _turn: StepState
    _agent: TurnContext
    number: int
    """1 for the first attempt of the step."""
    config: FrozenDict = _NO_CONFIG
    """The proposed config (empty until ``agent/request`` answered)."""
    asm: Assembler | None = None
    """The stream in flight: what it delivered so far."""

    async def run(self, decision: PreStepDecision) -> FrozenDict | Failure:
        """Make the call; returns the stored assistant message, or the failure it recorded.

        One coroutine from config to settled stream: it runs for every model call.
        """
        agent = self._agent
        if agent.listening(ATTEMPT_START):  # tracing starts its chat span here
            turn = self._turn
            position = {"turn": turn.number, "step": turn.step, "attempt": self.number}
            agent.notify(ATTEMPT_START, position)
        try:
            header = agent.log.state.header
            if (
                header is not None
                and not agent.series.first_request
                and not agent.hooks.has("waterfall", HOOK_REQUEST)
            ):
                config: FrozenDict = header["config"]  # frozen and validated when it was logged
            else:
                config = await self._propose_config()
            self.config = config
            prepared = await agent.services.router.prepare_call(config)
        except ModelError as exc:
            return self._unprepared(exc.failure)
        policy = agent.compaction
        if policy is not None and self.number == 1:  # near the window: compact first
            await before_request(agent, self._turn, prepared, policy)
        request = self._sync_phase(prepared, config, decision)
        asm = self.asm = Assembler()
        frames = agent.listening(ASSISTANT_STREAM)
        if frames:
            self.frame({"frame": "start"})
        failure: Failure | None = None
        stream = prepared.stream_fn(request)
        fold = FOLD_CHUNK
        try:
            async for chunk in stream:
                fold[type(chunk)](asm, chunk)
                if frames:
                    self.frame(
                        {
                            "frame": "chunk",
                            "index": getattr(chunk, "index", None),
                            "time": agent.services.clock(),
                            "chunk": chunk,
                        }
                    )
                del chunk  # not kept alive while the stream waits for the next one
        except ModelError as exc:
            failure = exc.failure
            await _close_stream(stream)
        except Exception as exc:  # an adapter bug is a coded failure, not a crashed loop
            failure = Failure("PROVIDER_ERROR", exception_text(exc))
            await _close_stream(stream)
        except BaseException:
            await _close_stream(stream)
            raise
        return self._settle(asm, failure, frames)

    def _unprepared(self, failure: Failure) -> Failure:
        """Record an attempt that obtained no stream (``agent/request`` or ``prepare_call``)."""
        turn = self._turn
        data = attempt_failure_data(
            turn.number, turn.step, self.number, FrozenDict(failure.to_data())
        )
        self._agent.log.add(ASSISTANT_ATTEMPT, data)
        return failure

    async def _propose_config(self) -> FrozenDict:
        agent = self._agent
        opts = agent.options
        logged = agent.log.state.header
        if agent.series.first_request or logged is None:
            proposal = {
                "provider": opts.provider,
                "model": opts.model,
                "reasoning_effort": opts.reasoning_effort,
                "max_tokens": opts.max_tokens,
            }
            proposal = {k: v for k, v in proposal.items() if v is not None}
        elif not agent.hooks.has("waterfall", HOOK_REQUEST):
            config: FrozenDict = logged["config"]  # already frozen and validated when logged
            return config
        else:
            proposal = dict(logged["config"])
        if agent.hooks.has("waterfall", HOOK_REQUEST):

            async def default(payload: Any) -> Any:
                return payload

            turn = self._turn
            payload = {
                "agent": agent.facade,
                "turn": turn.number,
                "step": turn.step,
                "attempt": self.number,
                "config": proposal,
            }
            result = await agent.hooks.waterfall(HOOK_REQUEST, payload, default)
            proposal = dict(result.get("config", result))
            proposal.pop("agent", None)
        if not proposal.get("provider") or not proposal.get("model"):
            raise ModelError(
                Failure(
                    "NO_ROUTE",
                    "the request needs both a provider and a model"
                    " (set them in AgentOptions or agent/request)",
                )
            )
        return FrozenDict(proposal)

    def _sync_phase(
        self, prepared: PreparedCall, config: FrozenDict, decision: PreStepDecision
    ) -> ModelRequest:
        """Reconcile the prompt, admit users, write request records, build the request.

        No awaits: a cancel lands before it or after it, never inside.
        """
        turn = self._turn
        series = self._agent.series
        schemas = turn.schemas
        new_series = series.starts(decision.starts_request_series, schemas)
        in_history = prepared.system_prompt_update == "in-history"
        series.reconcile_prompt(turn.number, turn.step, turn.rendered, in_history, new_series)
        turn.admit_users()
        series.write_records(config, prepared, schemas, new_series)
        return make_request(prepared.config, self._agent.log.derive_messages(), schemas)

    # -- streaming ------------------------------------------------------------------------
    def frame(self, data: dict[str, Any]) -> None:
        """Publish one ``agent/assistant-stream`` frame of this attempt (if someone listens)."""
        agent = self._agent
        if agent.listening(ASSISTANT_STREAM):
            turn = self._turn
            agent.notify(
                ASSISTANT_STREAM,
                {"turn": turn.number, "step": turn.step, "attempt": self.number, **data},
            )

    def _settle(
        self, asm: Assembler, failure: Failure | None, frames: bool
    ) -> FrozenDict | Failure:
        turn = self._turn
        session = self._agent.log
        finish: Finish | None = asm.finish
        if failure is None:
            if finish is None:
                failure = Failure("STREAM_CUT", "the model stream ended without a finish")
            elif finish.reason == "error":
                failure = finish.failure or Failure(
                    "PROVIDER_ERROR", "the provider reported an error"
                )
            elif finish.reason == "aborted":
                failure = Failure("PROVIDER_ERROR", "the provider aborted the stream")
        self.asm = None
        usage = asm.usage
        if usage is not None:
            turn.tokens += usage.input_tokens + usage.output_tokens
        if failure is not None:
            self._abandon(asm, failure, frames)
            return failure
        assert finish is not None
        records = self._agent.services.records
        stream = records.stream_record(self.number, finish.reason, finish.stop_reason)
        content = unique_call_ids(session, asm.content())
        record = assistant_message_data(
            turn.number,
            turn.step,
            content,
            stream,
            None if usage is None else records.usage_record(usage),
            None
            if finish.model is None and finish.response_id is None
            else response_data(finish.model, finish.response_id),
        )
        event = session.add(ASSISTANT_MESSAGE, record)
        if frames:
            self.frame({"frame": "end", "outcome": "committed", "seq": event.seq})
        if finish.reason == "max-tokens":
            turn.max_tokens = True
            turn.truncated = asm.has_cut_tool_call()
        message: FrozenDict = record["message"]
        return message

    def _abandon(self, asm: Assembler, failure: Failure, frames: bool) -> None:
        """Append the ``assistant/attempt`` of a failed attempt (what it delivered, and why)."""
        turn = self._turn
        text, reasoning = asm.delivered_text()
        data = abandoned_attempt_data(
            turn.number, turn.step, self.number, text, reasoning, FrozenDict(failure.to_data())
        )
        self._agent.log.add(ASSISTANT_ATTEMPT, data)
        if frames:
            self.frame({"frame": "end", "outcome": "abandoned"})

    def close(self) -> list[FrozenDict]:
        """Settle a stream cut by a cancel or failure (synchronous); returns its tool calls.

        What was delivered becomes an interrupted ``assistant/message``; the fully streamed tool
        calls in it are returned so the turn can settle them. Nothing delivered: an
        ``assistant/attempt``. No stream in flight: nothing.
        """
        asm, self.asm = self.asm, None
        if asm is None:
            return []
        turn = self._turn
        session = self._agent.log
        if not asm.delivered:
            data = attempt_failure_data(turn.number, turn.step, self.number, _ABORTED)
            session.add(ASSISTANT_ATTEMPT, data)
            self.frame({"frame": "end", "outcome": "abandoned"})
            return []
        content = unique_call_ids(session, asm.content())
        data = interrupted_message_data(turn.number, turn.step, self.number, content)
        event = session.add(ASSISTANT_MESSAGE, data)
        self.frame({"frame": "end", "outcome": "committed", "seq": event.seq})
        return [b for b in content if b["type"] == "tool-call"]

    async def offer_failure(self, failure: Failure) -> Retry | None:
        """Offer ``failure`` to ``agent/request-error``; the default policy is innermost."""
        agent = self._agent
        rng = agent.services.rng

        async def default_policy(payload: Any) -> Retry | None:
            delay = default_retry_delay(payload["failure"], payload["attempt"], rng)
            return None if delay is None else Retry(delay)

        turn = self._turn
        config: Mapping[str, Any] = self.config
        payload = {
            "agent": agent.facade,
            "turn": turn.number,
            "step": turn.step,
            "provider": config.get("provider"),
            "failure": failure,
            "attempt": self.number,
        }
        if agent.hooks.has("waterfall", HOOK_REQUEST_ERROR):
            result = await agent.hooks.waterfall(HOOK_REQUEST_ERROR, payload, default_policy)
        else:
            result = await default_policy(payload)
        if isinstance(result, Retry) and self.number < MAX_ATTEMPTS:
            return result
        return None


async def _close_stream(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_STREAM_TIMEOUT):
            await aclose()


def unique_call_ids(session: Session, content: tuple[FrozenDict, ...]) -> tuple[FrozenDict, ...]:
    """Rename tool-call ids already used in this session (a model may repeat or omit them).

    Every call must get exactly one ``tool/call`` and one ``tool/result``, and providers reject a
    request whose tool-call ids repeat; so a repeated (or empty) id becomes ``<id>~<n>``.
    """
    used = session.state.call_ids or {}
    seen: set[str] = set()
    out: list[FrozenDict] | None = None
    for i, block in enumerate(content):
        if block["type"] != "tool-call":
            continue
        call_id = block["call_id"]
        if call_id and call_id not in used and call_id not in seen:
            seen.add(call_id)
            continue
        n = 2
        while f"{call_id}~{n}" in used or f"{call_id}~{n}" in seen:
            n += 1
        new_id = f"{call_id}~{n}"
        seen.add(new_id)
        if out is None:
            out = list(content)
        out[i] = FrozenDict({**block, "call_id": new_id})
    return content if out is None else tuple(out)
