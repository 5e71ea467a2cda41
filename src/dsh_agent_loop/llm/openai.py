"""The ``openai`` adapter: OpenAI-compatible chat completions streamed over SSE.

Serves OpenAI, DeepSeek (``reasoning_content``), vLLM, Ollama and llama.cpp. Design notes:

* Requests are built from derived messages: every non-empty system node stays where it is (so
  in-history mode keeps later system messages in place), assistant messages carry
  ``tool_calls``, tool results become ``role: tool`` messages. Reasoning is never sent back
  (DeepSeek rejects ``reasoning_content`` in requests).
* The stream is normalised frame by frame by ``OpenAIStreamDecoder`` (pure, benchmarkable):
  text and reasoning open blocks as they start, tool calls are keyed by their ``index`` and
  open a block when first seen. Nothing marks the end of one call, so block ends are emitted at
  the finish frame; on ``length`` only calls whose arguments parse as JSON are ended, so a call
  cut by the output cap is dropped by the assembler. Usage follows the finish frame, so the
  ``finish`` chunk is held until ``[DONE]`` (or the end of the body).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, final

import httpx

from ._http import (
    DEFAULT_TIMEOUT,
    ClientPool,
    TimeoutSpec,
    endpoint,
    error_finish,
    failed_stream,
    post_stream,
    read_api_key,
    with_defaults,
)
from .base import (
    BlockEnd,
    BlockStart,
    Chunk,
    Failure,
    Finish,
    FinishReason,
    ModelError,
    ModelRequest,
    PreparedCall,
    ReasoningDelta,
    SystemPromptUpdate,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from .models import ModelInfo, resolve_model
from .sse import SSEEvent

__all__ = [
    "OpenAIAdapter",
    "OpenAIStreamDecoder",
    "build_openai_request",
    "openai_messages",
]

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"

_FINISH: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "content_filter": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "max-tokens",
}
_OVERLOADED: Final = frozenset({"insufficient_system_resource"})
"""DeepSeek's finish reason for a generation stopped by server load: a transient failure."""


def _text(content: Sequence[Mapping[str, Any]]) -> str:
    return "\n\n".join(b["text"] for b in content if b["type"] == "text" and b["text"])


def _assistant(content: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    text = _text(content)
    calls = [
        {
            "id": b["call_id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": b["arguments"]},
        }
        for b in content
        if b["type"] == "tool-call"
    ]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat-completions messages from derived messages (reasoning blocks are not sent)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        content = message["content"]
        if role == "system":
            if text := _text(content):  # an empty node sends nothing
                out.append({"role": "system", "content": text})
        elif role == "user":
            out.append({"role": "user", "content": _text(content)})
        elif role == "assistant":
            out.append(_assistant(content))
        elif role == "tool":
            for block in content:
                if block["type"] == "tool-result":
                    call_id = block.get("call_id") or message.get("call_id")
                    out.append({"role": "tool", "tool_call_id": call_id, "content": block["text"]})
    return out


def build_openai_request(
    request: ModelRequest, *, info: ModelInfo, stream_usage: bool = True
) -> dict[str, Any]:
    """The JSON body for one streamed chat-completions request."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": openai_messages(request.messages),
        "stream": True,
    }
    if stream_usage:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description") or "",
                    "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
                },
            }
            for tool in request.tools
        ]
    if (max_tokens := request.max_tokens) is not None:
        body[info.max_tokens_param] = max_tokens
    if (effort := request.reasoning_effort) is not None and info.reasoning_effort is not False:
        body["reasoning_effort"] = effort
    return body


def _usage(data: Mapping[str, Any]) -> Usage:
    prompt = data.get("prompt_tokens_details") or {}
    completion = data.get("completion_tokens_details") or {}
    cached = prompt.get("cached_tokens")
    if cached is None:
        cached = data.get("prompt_cache_hit_tokens")  # DeepSeek
    reasoning = completion.get("reasoning_tokens")
    return Usage(
        input_tokens=int(data.get("prompt_tokens") or 0),
        output_tokens=int(data.get("completion_tokens") or 0),
        cache_read_tokens=None if cached is None else int(cached),
        reasoning_tokens=None if reasoning is None else int(reasoning),
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _stream_error(error: Any) -> Finish:
    if isinstance(error, Mapping):
        message = str(error.get("message") or error)
        kind = f"{error.get('type') or ''} {error.get('code') or ''}".lower()
    else:
        message = kind = str(error)
    code = "HTTP_5XX" if "overloaded" in kind.lower() else "PROVIDER_ERROR"
    return error_finish(code, f"stream error: {message}")


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
    whose chunks end with the ``finish``; ``end()`` gives the final chunks at end of body.
    """

    __slots__ = ("_calls", "_finish", "_next", "_open", "_open_kind", "_usage", "done")

    def __init__(self) -> None:
        self.done = False
        self._next = 0
        self._open = -1
        self._open_kind: str | None = None
        self._calls: dict[int, _Call] = {}
        self._finish: Finish | None = None
        self._usage: Usage | None = None

    def feed(self, event: SSEEvent) -> list[Chunk]:
        """Normalise one SSE event.

        Raises:
            ValueError: the frame is not one JSON object.
        """
        data = event.data
        if data == "[DONE]":
            self.done = True
            return self.end() or [error_finish("STREAM_CUT", "[DONE] without a finish reason")]
        if event.event != "message":
            if event.event != "error":
                return []  # unknown event types are ignored
            self.done = True
            return [_stream_error(data)]
        frame = json.loads(data)
        if type(frame) is not dict:
            raise ValueError("frame is not a JSON object")
        return self.feed_frame(frame)

    def feed_frame(self, frame: Mapping[str, Any]) -> list[Chunk]:
        """Normalise one decoded ``chat.completion.chunk`` frame."""
        if (error := frame.get("error")) is not None or frame.get("object") == "error":
            self.done = True  # OpenAI/DeepSeek nest the error; vLLM sends it as the frame
            return [_stream_error(frame if error is None else error)]
        if usage := frame.get("usage"):
            self._usage = _usage(usage)
        choices = frame.get("choices")
        if not choices:
            return []
        choice = choices[0]
        if choice.get("index"):
            return []  # only the first choice is followed (n > 1 is not used)
        out: list[Chunk] = []
        if delta := choice.get("delta"):
            if reasoning := delta.get("reasoning_content") or delta.get("reasoning"):
                if self._open_kind != "reasoning":
                    self._open_block("reasoning", out)
                out.append(ReasoningDelta(self._open, reasoning))
            if text := delta.get("content"):
                if self._open_kind != "text":
                    self._open_block("text", out)
                out.append(TextDelta(self._open, text))
            if tool_calls := delta.get("tool_calls"):
                self._tool_calls(tool_calls, out)
        if (reason := choice.get("finish_reason")) and self._finish is None:
            self._on_finish(reason, out)
        return out

    def _open_block(self, kind: str | None, out: list[Chunk]) -> None:
        if self._open_kind is not None:
            out.append(BlockEnd(self._open))
        self._open_kind = kind
        if kind is None:
            return
        self._open = self._next
        self._next += 1
        out.append(BlockStart(self._open, "text" if kind == "text" else "reasoning"))

    def _tool_calls(self, tool_calls: Sequence[Mapping[str, Any]], out: list[Chunk]) -> None:
        for position, delta in enumerate(tool_calls):
            key = delta.get("index")
            if key is None:  # servers that omit it send whole calls, one per entry
                key = len(self._calls) if delta.get("id") else max(self._calls, default=position)
            function = delta.get("function") or {}
            call_id = delta.get("id") or None
            name = function.get("name") or None
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
                if not isinstance(arguments, str):  # some servers send the object itself
                    arguments = json.dumps(arguments, ensure_ascii=False)
                call.parts.append(arguments)
                out.append(ToolCallDelta(call.index, arguments))

    def _on_finish(self, reason: str, out: list[Chunk]) -> None:
        if reason in _OVERLOADED:
            self._finish = error_finish("HTTP_5XX", f"generation stopped: {reason}")
            return
        mapped = _FINISH.get(reason, "stop")
        if reason == "stop" and self._calls:
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
        self._finish = Finish(mapped, stop_reason=reason)

    def end(self) -> list[Chunk]:
        """The final ``[usage?, finish]`` if a finish reason arrived, else ``[]``."""
        if self._finish is None:
            return []
        if self._usage is None or self._finish.failure is not None:
            return [self._finish]
        return [UsageChunk(self._usage), self._finish]


_FROM_TABLE: Final = "auto"


@final
class OpenAIAdapter:
    """An OpenAI-compatible chat-completions provider (``kind: openai``).

    Args:
        name: The provider (route) name.
        base_url: The API root; requests go to ``{base_url}/chat/completions``.
        api_key_env: The env var holding the key, read at each call; None sends no key.
        headers: Extra request headers.
        timeout: ``(connect, read)`` seconds, ``{connect, read}`` or one number.
        stream_usage: Ask for usage in the stream (``stream_options.include_usage``).
        system_prompt_update: ``in-history``, ``head``/None, or ``auto`` (the model table).
        context_window: The provider-wide context window (overrides the table).
        models: Per-model overrides ``{NAME: {context_window, max_tokens, reasoning_effort}}``.
        transport: An httpx transport (tests: ``httpx.MockTransport``).
    """

    def __init__(
        self,
        name: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: TimeoutSpec = DEFAULT_TIMEOUT,
        stream_usage: bool = True,
        system_prompt_update: str | None = _FROM_TABLE,
        context_window: int | None = None,
        models: Mapping[str, Mapping[str, Any]] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if system_prompt_update not in (_FROM_TABLE, "in-history", "head", None):
            raise ValueError(
                f"system_prompt_update must be 'in-history' or 'head', not {system_prompt_update!r}"
            )
        self.name = name
        self.url = endpoint(base_url, "/chat/completions")
        self.api_key_env = api_key_env
        self._stream_usage = stream_usage
        self._update = None if system_prompt_update == "head" else system_prompt_update
        self._context_window = context_window
        self._models = models
        self._pool = ClientPool(headers=headers, timeout=timeout, transport=transport)

    async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
        """Resolve defaults for ``config`` from the model table and overrides.

        Raises:
            ModelError: ``AUTH`` when the key's env var is unset; ``INVALID_OPTION`` without a
                model.
        """
        read_api_key(self.api_key_env)
        model = config.get("model")
        if not model:
            raise ModelError(Failure("INVALID_OPTION", f"provider {self.name}: no model given"))
        info = resolve_model(str(model), models=self._models, context_window=self._context_window)
        defaults: dict[str, Any] = {}
        if config.get("max_tokens") is None and info.max_tokens is not None:
            defaults["max_tokens"] = info.max_tokens
        if config.get("reasoning_effort") is None and info.default_effort is not None:
            defaults["reasoning_effort"] = info.default_effort
        update: SystemPromptUpdate = info.system_prompt_update
        if self._update != _FROM_TABLE:
            update = "in-history" if self._update == "in-history" else None
        effective = {**config, **defaults}

        def stream_fn(request: ModelRequest) -> AsyncIterator[Chunk]:
            return self._stream(request, info, defaults)

        return PreparedCall(
            config=effective,
            stream_fn=stream_fn,
            adapter_defaults=defaults,
            context_window=info.context_window,
            system_prompt_update=update,
        )

    def _stream(
        self, request: ModelRequest, info: ModelInfo, defaults: Mapping[str, Any]
    ) -> AsyncIterator[Chunk]:
        try:
            key = read_api_key(self.api_key_env)
        except ModelError as exc:
            return failed_stream(exc.failure)
        body = build_openai_request(
            with_defaults(request, defaults), info=info, stream_usage=self._stream_usage
        )
        auth = {} if key is None else {"authorization": f"Bearer {key}"}
        return post_stream(
            self._pool,
            self.url,
            body,
            auth=auth,
            decoder=OpenAIStreamDecoder(),
            key_env=self.api_key_env,
        )

    async def aclose(self) -> None:
        """Close the pooled client (it is created again if the adapter is used later)."""
        await self._pool.aclose()
