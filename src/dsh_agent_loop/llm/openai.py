"""The ``openai`` adapter: OpenAI-compatible chat completions streamed over SSE.

Serves OpenAI, DeepSeek (``reasoning_content``), vLLM, Ollama and llama.cpp. Design notes:

* Requests are built from derived messages: every non-empty system node stays where it is (so
  in-history mode keeps later system messages in place), assistant messages carry
  ``tool_calls``, tool results become ``role: tool`` messages. Reasoning goes back as
  ``reasoning_content`` only as the model's ``reasoning_replay`` policy says (``models.py``):
  DeepSeek's thinking models need it on tool-call turns, other servers reject the field.
* The stream is normalised frame by frame by ``OpenAIStreamDecoder`` (pure, benchmarkable):
  text (a string, or a list of typed parts of which text parts count), refusal text and
  reasoning open blocks as they start, tool calls are keyed by their ``index`` and open a block
  when first seen. Nothing marks the end of one call, so block ends are emitted at the finish
  frame; on ``length`` only calls whose arguments parse as JSON are ended, so a call cut by the
  output cap is dropped by the assembler. Usage follows the finish frame, so the ``finish``
  chunk is held until ``[DONE]`` (or the end of the body). Several servers end with ``[DONE]``
  and no finish reason: after content that is a complete answer, not a cut stream.
* Every value read from a frame is type-checked before it becomes a chunk: a frame the decoder
  cannot read raises ``ValueError``, which the pump reports as a ``BAD_STREAM`` attempt failure
  (a malformed chunk must never reach the turn machine).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import httpx

from ._http import (
    DEFAULT_TIMEOUT,
    ClientPool,
    TimeoutSpec,
    endpoint,
    error_finish,
    error_message,
    failed_stream,
    post_stream,
    read_api_key,
    token_count,
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
from .models import REASONING_REPLAY_MODES, ModelInfo, ReasoningReplay, resolve_model
from .sse import SSEEvent

if TYPE_CHECKING:
    from ..config import OpenAIProviderConfig

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


def _reasoning(content: Sequence[Mapping[str, Any]]) -> str:
    return "\n\n".join(b["text"] for b in content if b["type"] == "reasoning" and b["text"])


def _assistant(content: Sequence[Mapping[str, Any]], replay: ReasoningReplay) -> dict[str, Any]:
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
        message: dict[str, Any] = {"role": "assistant", "content": text}
    else:
        message = {"role": "assistant", "content": text or None, "tool_calls": calls}
    if replay == "always" or (calls and replay == "tool-turns"):
        message["reasoning_content"] = _reasoning(content)  # "" too: omitting it is a 400
    return message


def openai_messages(
    messages: Sequence[Mapping[str, Any]], *, reasoning_replay: ReasoningReplay = "never"
) -> list[dict[str, Any]]:
    """Chat-completions messages from derived messages.

    Args:
        messages: Derived messages in log order.
        reasoning_replay: Which assistant messages carry ``reasoning_content`` (``never``,
            ``tool-turns``: those with tool calls, ``always``).
    """
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
            out.append(_assistant(content, reasoning_replay))
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
        "messages": openai_messages(request.messages, reasoning_replay=info.reasoning_replay),
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


def _content_text(content: Any) -> str:
    """The text of a delta's ``content`` given as a list of typed parts (text parts count)."""
    if type(content) is not list:
        raise ValueError("delta content is neither a string nor a list of parts")
    texts: list[str] = []
    for part in content:
        if type(part) is not dict or type(kind := part.get("type")) is not str:
            raise ValueError("a content part is not an object with a type")
        if kind == "text":
            if type(text := part.get("text")) is not str:
                raise ValueError("a text part has no string text")
            texts.append(text)
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
        "_next",
        "_open",
        "_open_kind",
        "_refused",
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

    def _delta(self, delta: Mapping[str, Any], out: list[Chunk]) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            if type(reasoning) is not str:
                raise ValueError("reasoning is not a string")
            if self._open_kind != "reasoning":
                self._open_block("reasoning", out)
            out.append(ReasoningDelta(self._open, reasoning))
        if text := delta.get("content"):
            if type(text) is not str:
                text = _content_text(text)
            self._text(text, out)
        if refusal := delta.get("refusal"):
            if type(refusal) is not str:
                raise ValueError("refusal is not a string")
            self._refused = True
            self._text(refusal, out)
        if tool_calls := delta.get("tool_calls"):
            if type(tool_calls) is not list:
                raise ValueError("tool_calls is not a list")
            self._tool_calls(tool_calls, out)

    def _text(self, text: str, out: list[Chunk]) -> None:
        if not text:
            return
        if self._open_kind != "text":
            self._open_block("text", out)
        out.append(TextDelta(self._open, text))

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
        self._finish = Finish(mapped, stop_reason=reason)

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


_FROM_TABLE: Final = "auto"


def _check_replay(value: Any, what: str) -> None:
    if value is not None and value not in REASONING_REPLAY_MODES:
        modes = ", ".join(REASONING_REPLAY_MODES)
        raise ValueError(f"{what} must be one of {modes}, not {value!r}")


@final
class OpenAIAdapter:
    """An OpenAI-compatible chat-completions provider (``kind: openai``).

    Args:
        name: The provider (route) name.
        base_url: The API root; requests go to ``{base_url}/chat/completions``.
        api_key_env: The env var holding the key, read at each call; None or ``""`` sends no
            key.
        headers: Extra request headers.
        timeout: ``(connect, read)`` seconds, ``{connect, read}`` or one number.
        stream_usage: Ask for usage in the stream (``stream_options.include_usage``).
        system_prompt_update: ``in-history``, ``head``/None, or ``auto`` (the model table).
        context_window: The provider-wide context window (overrides the table).
        reasoning_replay: ``never``, ``tool-turns`` or ``always`` for every model of the
            provider (None: the model table, ``never`` for unknown models).
        models: Per-model overrides
            ``{NAME: {context_window, max_tokens, reasoning_effort, reasoning_replay}}``.
        transport: An httpx transport (tests: ``httpx.MockTransport``).

    Raises:
        ValueError: an invalid ``system_prompt_update`` or ``reasoning_replay``.
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
        reasoning_replay: ReasoningReplay | None = None,
        models: Mapping[str, Mapping[str, Any]] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if system_prompt_update not in (_FROM_TABLE, "in-history", "head", None):
            raise ValueError(
                f"system_prompt_update must be 'in-history' or 'head', not {system_prompt_update!r}"
            )
        _check_replay(reasoning_replay, "reasoning_replay")
        for model, entry in (models or {}).items():
            _check_replay(entry.get("reasoning_replay"), f"models.{model}.reasoning_replay")
        self.name = name
        self.url = endpoint(base_url, "/chat/completions")
        self.api_key_env = api_key_env
        self._stream_usage = stream_usage
        self._update = None if system_prompt_update == "head" else system_prompt_update
        self._context_window = context_window
        self._replay = reasoning_replay
        self._models = models
        self._pool = ClientPool(headers=headers, timeout=timeout, transport=transport)

    @classmethod
    def from_config(
        cls,
        name: str,
        config: OpenAIProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> OpenAIAdapter:
        """Build from a ``kind: openai`` provider record the config layer has validated.

        Args:
            name: The provider (route) name.
            config: The validated record (``load_config(...).providers[name]``).
            transport: An httpx transport for the adapter's client (tests).
        """
        options: dict[str, Any] = {}
        if config.system_prompt_update is not None:  # None: the model table decides
            options["system_prompt_update"] = config.system_prompt_update
        return cls(
            name,
            base_url=config.base_url or DEFAULT_BASE_URL,
            api_key_env=config.api_key_env or None,
            headers=config.headers,
            timeout=(config.timeout.connect, config.timeout.read),
            stream_usage=config.stream_usage,
            context_window=config.context_window,
            reasoning_replay=config.reasoning_replay,
            models={
                model: attrs.asdict(entry, filter=lambda _, value: value is not None)
                for model, entry in config.models.items()
            },
            transport=transport,
            **options,
        )

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
        info = resolve_model(
            str(model),
            models=self._models,
            context_window=self._context_window,
            reasoning_replay=self._replay,
        )
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
