"""The ``openai`` adapter's stream decoder: chat-completion SSE frames into chunks.

Split from ``openai.py`` (which re-exports ``OpenAIStreamDecoder``). Pure and sans-I/O: every
value read from a frame is type-checked before it becomes a chunk, and a frame the decoder
cannot read raises ``ValueError`` (the pump reports it as a ``BAD_STREAM`` attempt failure).

A delta's ``content`` is a string or a list of typed parts, read in order: ``text`` parts are
the answer; ``thinking`` parts (Mistral's Magistral: ``{"type": "thinking", "thinking":
[{"type": "text", "text": ...}]}``, or the text as a string) are the model's reasoning, kept as
a reasoning block and never mixed into the answer. Parts of any other type are skipped, with a
debug log line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final, final

from ._base import (
    BlockEnd,
    BlockStart,
    Chunk,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from ._http import error_finish, error_message, token_count
from ._sse import SSEEvent

__all__ = ["OpenAIStreamDecoder"]

_log: Final = logging.getLogger("dsh_agent_loop.llm._openai")

_FINISH: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "content_filter": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "max-tokens",
}
_OVERLOADED: Final = frozenset({"insufficient_system_resource"})
"""DeepSeek's finish reason for a generation stopped by server load: a transient failure."""


def _usage(data: Any) -> Usage:
    if type(data) is not dict:
        raise ValueError("usage is not an object")
    prompt = _section(data, "prompt_tokens_details")
    completion = _section(data, "completion_tokens_details")
    cached = token_count(prompt, "cached_tokens")
    if cached is None:
        cached = token_count(data, "prompt_cache_hit_tokens")  # DeepSeek
    return Usage(
        input_tokens=token_count(data, "prompt_tokens") or 0,
        output_tokens=token_count(data, "completion_tokens") or 0,
        cache_read_tokens=cached,
        reasoning_tokens=token_count(completion, "reasoning_tokens"),
    )


_EMPTY: Final[Mapping[str, Any]] = {}


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return _EMPTY
    if type(value) is not dict:
        raise ValueError(f"{key} is not an object")
    return value


def _string(value: Any, what: str) -> str | None:
    """``value`` when it is a non-empty string, None when empty or absent."""
    if type(value) is str:
        return value or None
    if value is None:
        return None
    raise ValueError(f"{what} is not a string")


def _part_kind(part: Any) -> str:
    if type(part) is not dict or type(kind := part.get("type")) is not str:
        raise ValueError("a content part is not an object with a type")
    return kind


def _part_text(part: Mapping[str, Any]) -> str:
    if type(text := part.get("text")) is not str:
        raise ValueError("a text part has no string text")
    return text


def _skipped(kind: str, where: str) -> None:
    _log.debug("openai stream: skipped a %s part of unknown type %r", where, kind[:64])


def _thinking_text(part: Mapping[str, Any]) -> str:
    """The reasoning text of a ``thinking`` part: its text parts, or the text itself."""
    thinking = part.get("thinking")
    if type(thinking) is str:
        return thinking
    if type(thinking) is not list:
        raise ValueError("a thinking part's thinking is neither a string nor a list of parts")
    texts: list[str] = []
    for inner in thinking:
        kind = _part_kind(inner)
        if kind == "text":
            texts.append(_part_text(inner))
        else:
            _skipped(kind, "thinking")
    return "".join(texts)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _stream_error(error: Any) -> Finish:
    if isinstance(error, Mapping):
        kind = f"{error.get('type') or ''} {error.get('code') or ''}".lower()
    else:
        kind = str(error).lower()
    code = "HTTP_5XX" if "overloaded" in kind else "PROVIDER_ERROR"
    return error_finish(code, error_message(error))


def _event_error(data: str) -> Finish:
    """An SSE ``event: error``: its data is JSON (``{error: {...}}`` or the error) or text."""
    try:
        payload: Any = json.loads(data)
    except ValueError:
        payload = data
    if type(payload) is dict and payload.get("error") is not None:
        payload = payload["error"]
    return _stream_error(payload)


class _Call:
    __slots__ = ("call_id", "index", "name", "parts")

    def __init__(self, index: int, call_id: str | None, name: str | None) -> None:
        self.index = index
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []


@final
class OpenAIStreamDecoder:
    """Normalises one attempt's chat-completion frames into chunks (sans-I/O).

    ``feed(event)`` takes SSE events; ``feed_frame(frame)`` takes one decoded JSON frame and is
    the per-frame normalisation on its own. ``done`` turns true at ``[DONE]`` or an error frame,
    whose chunks end with the ``finish``; ``end()`` gives the final chunks at end of body. A
    frame that cannot be read raises ``ValueError`` (the pump's ``BAD_STREAM``).
    """

    __slots__ = (
        "_calls",
        "_finish",
        "_model",
        "_next",
        "_open",
        "_open_kind",
        "_refused",
        "_response_id",
        "_usage",
        "done",
    )

    def __init__(self) -> None:
        self.done = False
        self._next = 0
        self._open = -1
        self._open_kind: str | None = None
        self._calls: dict[int, _Call] = {}
        self._finish: Finish | None = None
        self._usage: Usage | None = None
        self._refused = False
        """Refusal text arrived: a plain ``stop`` is reported as ``refusal``."""
        self._model: str | None = None
        """The frames' ``model`` (the model that answered), kept for the finish."""
        self._response_id: str | None = None
        """The frames' ``id`` (the completion's id), kept for the finish."""

    def feed(self, event: SSEEvent) -> list[Chunk]:
        """Normalise one SSE event.

        Raises:
            ValueError: the frame is not one JSON object, or a value in it has the wrong type.
        """
        data = event.data
        if data == "[DONE]":
            self.done = True
            return self.end() or self._done_without_finish()
        if event.event != "message":
            if event.event != "error":
                return []  # unknown event types are ignored
            self.done = True
            return [_event_error(data)]
        frame = json.loads(data)
        if type(frame) is not dict:
            raise ValueError("frame is not a JSON object")
        return self.feed_frame(frame)

    def feed_frame(self, frame: Mapping[str, Any]) -> list[Chunk]:
        """Normalise one decoded ``chat.completion.chunk`` frame.

        Raises:
            ValueError: a value in the frame has the wrong type.
        """
        if (error := frame.get("error")) is not None or frame.get("object") == "error":
            self.done = True  # OpenAI/DeepSeek nest the error; vLLM sends it as the frame
            return [_stream_error(frame if error is None else error)]
        if usage := frame.get("usage"):
            self._usage = _usage(usage)
        if self._model is None or self._response_id is None:
            self._identify(frame)
        choices = frame.get("choices")
        if not choices:
            return []
        if type(choices) is not list or type(choice := choices[0]) is not dict:
            raise ValueError("choices is not a list of objects")
        if choice.get("index"):
            return []  # only the first choice is followed (n > 1 is not used)
        out: list[Chunk] = []
        if delta := choice.get("delta"):
            if type(delta) is not dict:
                raise ValueError("delta is not an object")
            self._delta(delta, out)
        if (reason := choice.get("finish_reason")) and self._finish is None:
            if type(reason) is not str:
                raise ValueError("finish_reason is not a string")
            self._on_finish(reason, out)
        return out

    def _identify(self, frame: Mapping[str, Any]) -> None:
        """Keep the frame's ``model`` and ``id`` (every chunk repeats them; the first wins).

        They only describe the response, so a value of the wrong type is ignored rather than
        failing the stream.
        """
        if self._model is None and type(model := frame.get("model")) is str and model:
            self._model = model
        if self._response_id is None and type(rid := frame.get("id")) is str and rid:
            self._response_id = rid

    def _delta(self, delta: Mapping[str, Any], out: list[Chunk]) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            if type(reasoning) is not str:
                raise ValueError("reasoning is not a string")
            self._reasoning(reasoning, out)
        if content := delta.get("content"):
            if type(content) is str:
                self._text(content, out)
            else:
                self._parts(content, out)
        if refusal := delta.get("refusal"):
            if type(refusal) is not str:
                raise ValueError("refusal is not a string")
            self._refused = True
            self._text(refusal, out)
        if tool_calls := delta.get("tool_calls"):
            if type(tool_calls) is not list:
                raise ValueError("tool_calls is not a list")
            self._tool_calls(tool_calls, out)

    def _parts(self, content: Any, out: list[Chunk]) -> None:
        """A ``content`` list of typed parts, in order (see the module doc)."""
        if type(content) is not list:
            raise ValueError("delta content is neither a string nor a list of parts")
        for part in content:
            kind = _part_kind(part)
            if kind == "text":
                self._text(_part_text(part), out)
            elif kind == "thinking":
                self._reasoning(_thinking_text(part), out)
            else:
                _skipped(kind, "content")

    def _text(self, text: str, out: list[Chunk]) -> None:
        if not text:
            return
        if self._open_kind != "text":
            self._open_block("text", out)
        out.append(TextDelta(self._open, text))

    def _reasoning(self, text: str, out: list[Chunk]) -> None:
        if not text:
            return
        if self._open_kind != "reasoning":
            self._open_block("reasoning", out)
        out.append(ReasoningDelta(self._open, text))

    def _open_block(self, kind: str | None, out: list[Chunk]) -> None:
        if self._open_kind is not None:
            out.append(BlockEnd(self._open))
        self._open_kind = kind
        if kind is None:
            return
        self._open = self._next
        self._next += 1
        out.append(BlockStart(self._open, "text" if kind == "text" else "reasoning"))

    def _tool_calls(self, tool_calls: Sequence[Any], out: list[Chunk]) -> None:
        for position, delta in enumerate(tool_calls):
            if type(delta) is not dict:
                raise ValueError("a tool_calls entry is not an object")
            function = delta.get("function")
            if function is None:
                function = _EMPTY
            elif type(function) is not dict:
                raise ValueError("a tool call's function is not an object")
            call_id = _string(delta.get("id"), "a tool call id")
            name = _string(function.get("name"), "a tool call name")
            key = delta.get("index")
            if key is None:  # servers that omit it send whole calls, one per entry
                key = len(self._calls) if call_id else max(self._calls, default=position)
            elif type(key) is not int:
                raise ValueError("a tool call index is not an integer")
            call = self._calls.get(key)
            if call is None:
                self._open_block(None, out)
                call = self._calls[key] = _Call(self._next, call_id, name)
                self._next += 1
                out.append(BlockStart(call.index, "tool-call", call_id, name))
            elif (call_id and not call.call_id) or (name and not call.name):
                call.call_id = call.call_id or call_id
                call.name = call.name or name
                out.append(BlockStart(call.index, "tool-call", call.call_id, call.name))
            arguments = function.get("arguments")
            if arguments:
                if type(arguments) is not str:
                    if type(arguments) is not dict:  # some servers send the object itself
                        raise ValueError("tool call arguments are not a string")
                    arguments = json.dumps(arguments, ensure_ascii=False)
                call.parts.append(arguments)
                out.append(ToolCallDelta(call.index, arguments))

    def _on_finish(self, reason: str | None, out: list[Chunk]) -> None:
        """Finish with the provider's ``reason`` (None: ``[DONE]`` came without one)."""
        if reason in _OVERLOADED:
            self._finish = error_finish("HTTP_5XX", f"generation stopped: {reason}")
            return
        mapped = "stop" if reason is None else _FINISH.get(reason, "stop")
        if reason in ("stop", None) and self._calls:
            mapped = "tool-calls"  # servers (Ollama, some vLLM) that report "stop" after calls
        self._open_block(None, out)
        for call in self._calls.values():
            if mapped == "max-tokens":
                if call.parts and _is_json("".join(call.parts)):
                    out.append(BlockEnd(call.index))
                continue
            if not call.parts:  # a call without arguments: make them parse
                out.append(ToolCallDelta(call.index, "{}"))
            out.append(BlockEnd(call.index))
        if self._refused and reason in ("stop", None):
            reason = "refusal"
        self._finish = Finish(
            mapped, stop_reason=reason, model=self._model, response_id=self._response_id
        )

    def _done_without_finish(self) -> list[Chunk]:
        """``[DONE]`` with no finish reason: complete after content, else a cut stream."""
        if self._next == 0:
            return [error_finish("STREAM_CUT", "[DONE] before any content or finish reason")]
        out: list[Chunk] = []
        self._on_finish(None, out)
        return out + self.end()

    def end(self) -> list[Chunk]:
        """The final ``[usage?, finish]`` if a finish reason arrived, else ``[]``."""
        if self._finish is None:
            return []
        if self._usage is None or self._finish.failure is not None:
            return [self._finish]
        return [UsageChunk(self._usage), self._finish]
