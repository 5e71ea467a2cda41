"""``ScriptedModel``: a deterministic model adapter for tests, demos and simulations.

Each request takes the next ``Reply`` of the script (a callable entry is called with the
request and returns a ``Reply``). Replies stream like a provider's: reasoning and text chunked
by word, tool calls as a block with its JSON arguments in one delta, then usage and a finish.
The stream yields to the scheduler once per delta chunk (``trio.sleep(latency)``, or a
checkpoint when latency is 0), so cancellation can land between any two deltas and
everything runs under ``MockClock(autojump_threshold=0)``. Running out of script is an error
reply (``SCRIPT_EXHAUSTED``), not a hang.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, cast, final

import attrs
import trio
from msgspec import Struct

from .._frozen import json_default
from ._base import (
    BlockEnd,
    BlockStart,
    Chunk,
    Failure,
    Finish,
    ModelRequest,
    PreparedCall,
    ReasoningDelta,
    SystemPromptUpdate,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
    make_tool_call_start,
    make_usage,
)

__all__ = ["Reply", "ScriptedModel"]

_WORDS = re.compile(r"\s*\S+\s*|\s+")
ToolCallSpec = tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], str]


def _split_words(text: str) -> list[str]:
    return _WORDS.findall(text) if text else []


@final
@attrs.frozen
class Reply:
    """One scripted model response. Build with the class methods (``Reply.text(...)``, ...)."""

    content: str = ""
    """Text streamed before any tool call (for errors and hangs: before failing or hanging)."""
    thinking: str | None = None
    """Reasoning streamed first."""
    calls: tuple[tuple[str, str, str | None], ...] = ()
    """Complete tool calls: (name, JSON arguments, call id or None)."""
    kind: Literal["complete", "error", "max-tokens", "hang"] = "complete"
    failure: Failure | None = None
    cut_tool_call: tuple[str, str] | None = None
    """max-tokens only: (name, partial arguments) of a call cut by the cap."""
    usage: Usage | None = None
    _plan: _Plan | None = attrs.field(default=None, init=False, eq=False, repr=False)
    """The reply's chunks, built on its first use (a ``Reply`` is immutable)."""

    @staticmethod
    def _calls(calls: Iterable[Sequence[Any]]) -> tuple[tuple[str, str, str | None], ...]:
        out = []
        for call in calls:
            name, args = call[0], call[1]
            call_id = call[2] if len(call) > 2 else None
            raw = (
                args
                if isinstance(args, str)
                else json.dumps(args, separators=(",", ":"), default=json_default)
            )
            out.append((str(name), raw, call_id))
        return tuple(out)

    @classmethod
    def text(cls, text: str, reasoning: str | None = None, *, usage: Usage | None = None) -> Reply:
        """Answer ``text`` (after ``reasoning``, when given) and stop."""
        return cls(content=text, thinking=reasoning, usage=usage)

    @classmethod
    def tool_calls(
        cls, *calls: ToolCallSpec, text: str = "", reasoning: str | None = None
    ) -> Reply:
        """Call tools: each call is ``(name, arguments)`` or ``(name, arguments, call_id)``."""
        return cls(content=text, thinking=reasoning, calls=cls._calls(calls))

    @classmethod
    def error(
        cls,
        code: str,
        message: str = "",
        *,
        after_text: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> Reply:
        """Fail the attempt with ``code`` after streaming ``after_text``."""
        failure = Failure(code, message or code, status=status, retry_after=retry_after)
        return cls(content=after_text, kind="error", failure=failure)

    @classmethod
    def max_tokens(
        cls,
        text: str = "",
        tool_calls: Iterable[ToolCallSpec] = (),
        *,
        cut_tool_call: tuple[str, str] | None = None,
    ) -> Reply:
        """Finish ``max-tokens`` after ``text`` and the complete ``tool_calls``.

        ``cut_tool_call=(name, partial_json)`` adds a call whose arguments never completed.
        """
        return cls(
            content=text,
            calls=cls._calls(tool_calls),
            kind="max-tokens",
            cut_tool_call=cut_tool_call,
        )

    @classmethod
    def hang(cls, after_text: str = "") -> Reply:
        """Stream ``after_text``, then wait until cancelled."""
        return cls(content=after_text, kind="hang")


ScriptEntry = Reply | Callable[[ModelRequest], Reply]


@final
class ScriptedModel:
    """A model adapter that answers from a script. ``requests`` records every request.

    ``record=False`` keeps ``requests`` empty: a long simulation need not hold every request
    it ever sent (no real provider adapter does).
    """

    def __init__(
        self,
        replies: Iterable[ScriptEntry] = (),
        *,
        latency: float = 0.0,
        system_prompt_update: SystemPromptUpdate = None,
        loop: bool = False,
        context_window: int | None = None,
        record: bool = True,
    ) -> None:
        self.replies: list[ScriptEntry] = list(replies)
        self.record = record
        self.latency = latency
        self.system_prompt_update = system_prompt_update
        self.loop = loop
        self.context_window = context_window
        self.requests: list[ModelRequest] = []
        self._next = 0
        self._call_ids = itertools.count(1)
        # Explicit call ids in the script are reserved, so numbered ids never collide with them.
        self._reserved: set[str] = set()
        self._reserve(self.replies)
        self._prepared: PreparedCall | None = None

    def add(self, *entries: ScriptEntry) -> None:
        """Append entries to the script."""
        self.replies.extend(entries)
        self._reserve(entries)

    def _reserve(self, entries: Iterable[ScriptEntry]) -> None:
        for entry in entries:
            if isinstance(entry, Reply):
                self._reserved.update(cid for _, _, cid in entry.calls if cid is not None)

    def _new_call_id(self) -> str:
        while True:
            cid = f"call-{next(self._call_ids)}"
            if cid not in self._reserved:
                return cid

    async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
        """Resolve ``config`` (nothing to default) for this scripted route."""
        last = self._prepared
        if last is not None and (last.config is config or last.config == config):
            return last  # the same route as last time (shared by agents with equal configs)
        prepared = PreparedCall(
            config=config,
            stream_fn=self._stream,
            context_window=self.context_window,
            system_prompt_update=self.system_prompt_update,
        )
        self._prepared = prepared
        return prepared

    async def aclose(self) -> None:
        """Nothing to release."""

    def _take(self, request: ModelRequest) -> Reply:
        if self._next >= len(self.replies):
            if not (self.loop and self.replies):
                return Reply.error("SCRIPT_EXHAUSTED", "the scripted model has no reply left")
            self._next = 0
        entry = self.replies[self._next]
        self._next += 1
        return entry(request) if callable(entry) else entry

    @staticmethod
    def _plan(reply: Reply) -> _Plan:
        # Kept on the reply itself: no cache to bound, and a reply function that builds a new
        # ``Reply`` per request leaves nothing behind once the reply is gone.
        plan = reply._plan
        if plan is None:
            plan = _Plan(reply)
            object.__setattr__(reply, "_plan", plan)
        return plan

    def _stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        return _ScriptedStream(self, request)


@final
class _ScriptedStream(Struct, gc=False, eq=False):
    """One scripted stream: its reply's plan, step by step, pausing where the plan says.

    The request is recorded and the reply taken on the first ``__anext__`` (when an async
    generator's body would start). A class rather than an async generator, and not GC-tracked
    (a ``msgspec.Struct`` declared ``gc=False``; it refers to its model, request, reply and plan,
    none of which refers back): with thousands of agents mid-stream, what a stream holds outlives
    many collections of the young generations, and an async generator adds four tracked objects
    (itself, its ``asend``, its frame's iterator, and the weak reference trio's async-generator
    hooks keep to it) plus a Python-level ``WeakSet`` update at its start and end.
    """

    _model: ScriptedModel
    _request: ModelRequest
    _reply: Reply | None = None
    _plan: _Plan | None = None
    _pos: int = 0
    """Steps of the plan taken so far; -1 once the stream ended or was closed."""

    def __aiter__(self) -> _ScriptedStream:
        return self

    async def __anext__(self) -> Chunk:
        plan = self._plan
        if plan is None:
            plan = self._start()
        pos = self._pos
        steps = plan.steps
        if pos < 0 or pos >= len(steps):
            self._pos = -1
            raise StopAsyncIteration
        self._pos = pos + 1
        op, value = steps[pos]
        if op is _CHUNK:
            return value  # type: ignore[return-value]
        model = self._model
        if op is _PAUSED:
            # Inline, not a helper, and a checkpoint in its two halves (a schedule point, then
            # a cancel point, as ``trio.lowlevel.checkpoint`` does them): a coroutine frame
            # less alive while the stream waits for its turn.
            if model.latency > 0:
                await trio.sleep(model.latency)
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                await trio.lowlevel.checkpoint_if_cancelled()
            return value  # type: ignore[return-value]
        if op is _START:
            index, name, call_id = cast("tuple[int, str, str | None]", value)
            return make_tool_call_start(index, call_id or model._new_call_id(), name)
        if op is _USAGE:
            reply = self._reply
            assert reply is not None
            return UsageChunk(reply.usage or _usage(self._request, plan))
        await trio.sleep_forever()  # _HANG
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self) -> _Plan:
        """Record the request and take the reply (the first ``__anext__``)."""
        if self._pos < 0:  # closed before it started
            raise StopAsyncIteration
        model, request = self._model, self._request
        if model.record:
            model.requests.append(request)
        reply = self._reply = model._take(request)
        plan = self._plan = model._plan(reply)
        return plan

    async def aclose(self) -> None:
        """End the stream (nothing to release)."""
        self._pos = -1


# What a plan's step does: give a chunk; pause, then give it; start a tool call (a new call id
# when the script names none); give the usage (the request's estimate unless the reply names
# one); hang forever.
_CHUNK, _PAUSED, _START, _USAGE, _HANG = "chunk", "paused", "start", "usage", "hang"

_Step = tuple[str, object]


_CallPlan = tuple[int, str, "str | None", "ToolCallDelta | None", "BlockEnd | None"]


class _Plan:
    """The chunks of one ``Reply`` that do not depend on the request, built once."""

    __slots__ = ("call_chars", "out_words", "steps")

    def __init__(self, reply: Reply) -> None:
        head: list[_Step] = []
        index = 0
        out_words = 0
        for kind, text in (("reasoning", reply.thinking or ""), ("text", reply.content)):
            words = _split_words(text)
            if not words:
                continue
            head.append((_CHUNK, BlockStart(index, kind)))  # type: ignore[arg-type]
            for word in words:
                chunk: Chunk = (
                    ReasoningDelta(index, word) if kind == "reasoning" else TextDelta(index, word)
                )
                head.append((_PAUSED, chunk))
            head.append((_CHUNK, BlockEnd(index)))
            out_words += len(words)
            index += 1
        calls: list[_CallPlan] = []
        for name, raw, call_id in reply.calls:
            call_delta = ToolCallDelta(index, raw) if raw else None
            calls.append((index, name, call_id, call_delta, BlockEnd(index)))
            index += 1
        if reply.cut_tool_call is not None:
            name, raw = reply.cut_tool_call
            calls.append((index, name, None, ToolCallDelta(index, raw) if raw else None, None))
        self.out_words = out_words
        self.call_chars = sum(len(raw) for _, raw, _ in reply.calls)
        if reply.kind == "error":
            finish = Finish("error", failure=reply.failure)
        elif reply.kind == "max-tokens":
            finish = Finish("max-tokens", stop_reason="max_tokens")
        elif reply.calls:
            finish = Finish("tool-calls", stop_reason="tool_calls")
        else:
            finish = Finish("stop", stop_reason="stop")
        self.steps = (*head, *_tail(reply, calls, finish))
        """What a stream of the reply does, step by step (``_ScriptedStream``): its text and
        reasoning word by word (a pause before each word), then what ``_tail`` adds."""


def _tail(reply: Reply, calls: Sequence[_CallPlan], finish: Finish) -> tuple[_Step, ...]:
    """What a stream of ``reply`` gives after its text: calls, usage, finish (or hangs)."""
    if reply.kind == "hang":
        return ((_HANG, None),)
    if reply.kind == "error":
        return ((_CHUNK, finish),)
    tail: list[_Step] = []
    for index, name, call_id, delta, end in calls:
        tail.append((_START, (index, name, call_id)))
        if delta is not None:
            tail.append((_PAUSED, delta))
        if end is not None:
            tail.append((_CHUNK, end))
    tail.append((_USAGE, None))
    tail.append((_CHUNK, finish))
    return tuple(tail)


def _usage(request: ModelRequest, plan: _Plan) -> Usage:
    """A deterministic usage estimate in O(1): 10 tokens a message plus the newest message."""
    messages = request.messages
    n = len(messages)
    last = 0
    if n:
        for block in messages[n - 1].get("content", ()):
            last += len(block.get("text", "")) + len(block.get("arguments", ""))
    return make_usage(10 * n + last // 4, plan.out_words + plan.call_chars // 4)
