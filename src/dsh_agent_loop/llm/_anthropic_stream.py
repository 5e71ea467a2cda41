"""The ``anthropic`` adapter's stream decoder: Messages API SSE events into chunks.

Split from ``anthropic.py`` (which re-exports ``AnthropicStreamDecoder``). Pure and sans-I/O:
every value read from a frame is type-checked before it becomes a chunk, and a frame the
decoder cannot read raises ``ValueError`` (the pump reports it as a ``BAD_STREAM`` failure).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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

__all__ = ["AnthropicStreamDecoder"]

_STOP: Final[Mapping[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "refusal": "stop",
    "pause_turn": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
    "model_context_window_exceeded": "max-tokens",
}


def _usage(data: Any, base: Usage | None) -> Usage:
    """Usage from ``message_start``/``message_delta``; input counts cached prompt tokens too.

    Raises:
        ValueError: the usage is not an object of token counts.
    """
    if type(data) is not dict:
        raise ValueError("usage is not an object")
    input_tokens = token_count(data, "input_tokens")
    cache_read = token_count(data, "cache_read_input_tokens")
    cache_write = token_count(data, "cache_creation_input_tokens")
    if input_tokens is not None or cache_read is not None:
        total_in = (input_tokens or 0) + (cache_read or 0) + (cache_write or 0)
    else:
        total_in = base.input_tokens if base else 0
    if cache_read is None and base is not None:
        cache_read = base.cache_read_tokens
    output = token_count(data, "output_tokens")
    return Usage(
        input_tokens=total_in,
        output_tokens=output if output is not None else (base.output_tokens if base else 0),
        cache_read_tokens=cache_read,
    )


def _object(frame: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = frame.get(key)
    if type(value) is not dict:
        raise ValueError(f"{key} is not an object")
    return value


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if type(value) is not str:
        raise ValueError(f"{key} is not a string")
    return value


def _optional_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or type(value) is str:
        return value
    raise ValueError(f"{key} is not a string")


def _index(frame: Mapping[str, Any]) -> int:
    index = frame.get("index")
    if type(index) is not int:
        raise ValueError("index is not an integer")
    return index


class _Block:
    __slots__ = ("arguments", "index", "kind", "signature")

    def __init__(self, index: int, kind: str) -> None:
        self.index = index
        self.kind = kind
        self.arguments: list[str] = []
        self.signature: str | None = None


@final
class AnthropicStreamDecoder:
    """Normalises one attempt's Messages stream events into chunks (sans-I/O).

    ``done`` turns true at ``message_stop`` or an ``error`` event, whose chunks end with the
    ``finish``; ``end()`` gives the final chunks when the body ends without ``message_stop``.
    Every value a chunk is made from is type-checked: an event that cannot be read raises
    ``ValueError`` (the pump's ``BAD_STREAM``).
    """

    __slots__ = ("_blocks", "_finish", "_model", "_next", "_response_id", "_usage", "done")

    def __init__(self) -> None:
        self.done = False
        self._blocks: dict[int, _Block | None] = {}
        """Provider block index → our block (None: a block type we do not surface)."""
        self._next = 0
        self._finish: Finish | None = None
        self._usage: Usage | None = None
        self._model: str | None = None
        """``message_start``'s ``message.model`` (the model that answered), kept for the finish."""
        self._response_id: str | None = None
        """``message_start``'s ``message.id``, kept for the finish."""

    def feed(self, event: SSEEvent) -> list[Chunk]:
        """Normalise one SSE event.

        Raises:
            ValueError: the frame is not one JSON object, or a value in it has the wrong type.
        """
        if event.event == "error":
            return self._error_event(event.data)
        frame = json.loads(event.data)
        if type(frame) is not dict:
            raise ValueError("frame is not a JSON object")
        return self.feed_frame(frame, event.event)

    def _error_event(self, data: str) -> list[Chunk]:
        """An ``event: error``: JSON ``{type: error, error: {...}}`` or, from proxies, text."""
        try:
            frame: Any = json.loads(data)
        except ValueError:
            frame = data
        self.done = True
        if type(frame) is dict:
            return [self._error(frame.get("error") or frame)]
        return [self._error(frame)]

    def feed_frame(self, frame: Mapping[str, Any], event: str = "message") -> list[Chunk]:
        """Normalise one decoded stream frame (dispatched on its ``type``).

        Raises:
            ValueError: a value in the frame has the wrong type.
        """
        kind = frame.get("type") or event
        if kind == "content_block_delta":
            return self._delta(frame)
        if kind == "content_block_start":
            return self._start(frame)
        if kind == "content_block_stop":
            return self._stop(frame)
        if kind == "message_start":
            message = _object(frame, "message")
            self._usage = _usage(message.get("usage") or {}, None)
            self._identify(message)
        elif kind == "message_delta":
            self._message_delta(frame)
        elif kind == "message_stop":
            self.done = True
            return self.end() or [error_finish("STREAM_CUT", "message_stop without a stop reason")]
        elif kind == "error":
            self.done = True
            return [self._error(frame.get("error"))]
        return []  # ping and unknown event types

    def _start(self, frame: Mapping[str, Any]) -> list[Chunk]:
        index = _index(frame)
        content = _object(frame, "content_block")
        ctype = content.get("type")
        if ctype not in ("text", "thinking", "redacted_thinking", "tool_use"):
            self._blocks[index] = None
            return []
        block = _Block(self._next, ctype)
        self._next += 1
        self._blocks[index] = block
        if ctype == "tool_use":
            return self._tool_start(block, content)
        if ctype == "text":
            out: list[Chunk] = [BlockStart(block.index, "text")]
            if text := _optional_str(content, "text"):
                out.append(TextDelta(block.index, text))
            return out
        out = [BlockStart(block.index, "reasoning")]
        if ctype == "redacted_thinking":
            block.signature = _optional_str(content, "data") or ""
        else:
            block.signature = _optional_str(content, "signature") or None
            if thinking := _optional_str(content, "thinking"):
                out.append(ReasoningDelta(block.index, thinking))
        return out

    @staticmethod
    def _tool_start(block: _Block, content: Mapping[str, Any]) -> list[Chunk]:
        call_id = _str(content, "id")
        name = _str(content, "name")
        tool_input = content.get("input")
        if tool_input:  # whole input up front (no deltas will follow)
            if type(tool_input) is not dict:
                raise ValueError("tool_use input is not an object")
            block.arguments.append(json.dumps(tool_input, ensure_ascii=False))
        out: list[Chunk] = [BlockStart(block.index, "tool-call", call_id, name)]
        out += [ToolCallDelta(block.index, a) for a in block.arguments]
        return out

    def _delta(self, frame: Mapping[str, Any]) -> list[Chunk]:
        block = self._blocks.get(_index(frame))
        if block is None:
            return []
        delta = _object(frame, "delta")
        dtype = delta.get("type")
        if dtype == "text_delta":
            return [TextDelta(block.index, text)] if (text := _str(delta, "text")) else []
        if dtype == "input_json_delta":
            if not (piece := _str(delta, "partial_json")):
                return []
            block.arguments.append(piece)
            return [ToolCallDelta(block.index, piece)]
        if dtype == "thinking_delta":
            thinking = _str(delta, "thinking")
            return [ReasoningDelta(block.index, thinking)] if thinking else []
        if dtype == "signature_delta":
            block.signature = (block.signature or "") + _str(delta, "signature")
        return []  # citations and unknown delta types

    def _stop(self, frame: Mapping[str, Any]) -> list[Chunk]:
        block = self._blocks.get(_index(frame))
        if block is None:
            return []
        if block.kind == "tool_use":
            if not block.arguments:
                block.arguments.append("{}")
                return [ToolCallDelta(block.index, "{}"), BlockEnd(block.index)]
            try:
                json.loads("".join(block.arguments))
            except ValueError:
                return []  # cut arguments: only a normal finish may still complete the call
            return [BlockEnd(block.index)]
        if block.kind == "redacted_thinking":
            return [BlockEnd(block.index, {"redacted": block.signature})]
        if block.kind == "thinking" and block.signature:
            return [BlockEnd(block.index, {"signature": block.signature})]
        return [BlockEnd(block.index)]

    def _identify(self, message: Mapping[str, Any]) -> None:
        """Keep ``message.model`` and ``message.id`` for the finish.

        They only describe the response, so a value of the wrong type is ignored rather than
        failing the stream.
        """
        if type(model := message.get("model")) is str and model:
            self._model = model
        if type(rid := message.get("id")) is str and rid:
            self._response_id = rid

    def _message_delta(self, frame: Mapping[str, Any]) -> None:
        if usage := frame.get("usage"):
            self._usage = _usage(usage, self._usage)
        delta = frame.get("delta")
        if delta is None:
            return
        if type(delta) is not dict:
            raise ValueError("delta is not an object")
        reason = _optional_str(delta, "stop_reason")
        if reason and self._finish is None:
            self._finish = Finish(
                _STOP.get(reason, "stop"),
                stop_reason=reason,
                model=self._model,
                response_id=self._response_id,
            )

    @staticmethod
    def _error(error: Any) -> Finish:
        overloaded = isinstance(error, Mapping) and error.get("type") == "overloaded_error"
        return error_finish("HTTP_5XX" if overloaded else "PROVIDER_ERROR", error_message(error))

    def end(self) -> list[Chunk]:
        """The final ``[usage?, finish]`` if a stop reason arrived, else ``[]``."""
        if self._finish is None:
            return []
        if self._usage is None:
            return [self._finish]
        return [UsageChunk(self._usage), self._finish]
