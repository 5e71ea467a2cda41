"""The ``anthropic`` adapter: the Messages API streamed over SSE.

Design notes:

* Head mode only: the effective system prompt (the latest non-empty system node) is the
  top-level ``system`` field; ``system_prompt_update`` is None.
* Requests: consecutive tool results and user messages merge into one user message with the
  ``tool_result`` blocks first (the API wants the results of an assistant turn's ``tool_use``
  blocks at the head of the next user turn); tool calls go out as ``tool_use`` with parsed
  input; thinking blocks with their signatures (and redacted thinking) go back only inside the
  current tool loop — after the last user turn that is not just tool results — which is where
  the API requires them; older ones would be stripped by the API anyway.
* ``reasoning_effort`` maps to a thinking budget; ``max_tokens`` (required by the API) then
  defaults to 8,192 above the budget. Both are recorded as adapter defaults.
* The stream (``AnthropicStreamDecoder``) maps content blocks to chunk blocks by first
  appearance. A ``tool_use`` block ends at ``content_block_stop`` only when its arguments
  parse: a call cut by ``max_tokens`` stays unended and is dropped by the assembler, while a
  normal finish completes every block anyway.
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
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from .models import lookup_model, resolve_model
from .sse import SSEEvent

if TYPE_CHECKING:
    from ..config import AnthropicProviderConfig

__all__ = [
    "THINKING_BUDGETS",
    "AnthropicAdapter",
    "AnthropicStreamDecoder",
    "anthropic_messages",
    "build_anthropic_request",
]

DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
API_VERSION: Final = "2023-06-01"

#: Thinking budget (tokens) per reasoning effort; ``none``/``off`` disable thinking.
THINKING_BUDGETS: Final[Mapping[str, int]] = {"low": 1_024, "medium": 4_096, "high": 16_384}
_NO_THINKING: Final = frozenset({"none", "off", "disabled"})
_MIN_BUDGET: Final = 1_024
_ABOVE_BUDGET: Final = 8_192
_DEFAULT_MAX_TOKENS: Final = 8_192

_STOP: Final[Mapping[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "refusal": "stop",
    "pause_turn": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
    "model_context_window_exceeded": "max-tokens",
}


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}  # a completed call with broken arguments; its result already says so
    return value if isinstance(value, dict) else {}


def _assistant_blocks(content: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in content:
        kind = block["type"]
        if kind == "text":
            if block["text"]:
                out.append({"type": "text", "text": block["text"]})
        elif kind == "tool-call":
            out.append(
                {
                    "type": "tool_use",
                    "id": block["call_id"],
                    "name": block["name"],
                    "input": _tool_input(block["arguments"]),
                }
            )
        elif kind == "reasoning":
            meta = block.get("metadata") or {}
            if meta.get("redacted"):
                out.append({"type": "redacted_thinking", "data": meta["redacted"]})
            elif meta.get("signature"):
                out.append(
                    {"type": "thinking", "thinking": block["text"], "signature": meta["signature"]}
                )
    return out


def _user_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message["content"]:
        if block["type"] == "tool-result":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": block.get("call_id") or message.get("call_id"),
                "is_error": bool(block.get("is_error")),
            }
            if block["text"]:
                result["content"] = block["text"]
            out.append(result)
        elif block["type"] == "text" and block["text"]:
            out.append({"type": "text", "text": block["text"]})
    return out


def _merge(turns: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for role, blocks in turns:
        if not blocks:
            continue  # the API rejects empty turns; neighbours of one role merge below
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": role, "content": list(blocks)})
    for message in merged:
        if message["role"] == "user":  # tool results first, each group in its own order
            message["content"].sort(key=lambda b: b["type"] != "tool_result")
    return merged


def _strip_old_thinking(messages: list[dict[str, Any]]) -> None:
    start = 0
    for i, message in enumerate(messages):
        if message["role"] == "user" and all(
            b["type"] != "tool_result" for b in message["content"]
        ):
            start = i
    for message in messages[:start]:
        if message["role"] == "assistant":
            message["content"] = [
                b for b in message["content"] if b["type"] not in ("thinking", "redacted_thinking")
            ]


def anthropic_messages(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """``(system, messages)`` for the Messages API from derived messages."""
    system = ""
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for message in messages:
        role = message["role"]
        if role == "system":
            text = "\n\n".join(b["text"] for b in message["content"] if b["type"] == "text")
            if text:
                system = text  # the effective prompt is the latest non-empty node
        elif role == "assistant":
            turns.append(("assistant", _assistant_blocks(message["content"])))
        elif role in ("user", "tool"):
            turns.append(("user", _user_blocks(message)))
    merged = _merge(turns)
    _strip_old_thinking(merged)
    # A turn that held only old thinking is gone now: merge its neighbours again.
    return system, _merge([(m["role"], m["content"]) for m in merged])


def build_anthropic_request(request: ModelRequest) -> dict[str, Any]:
    """The JSON body for one streamed Messages request (config already resolved)."""
    system, messages = anthropic_messages(request.messages)
    max_tokens = request.max_tokens
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": _DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        "messages": messages,
        "stream": True,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [
            {
                "name": tool["name"],
                "description": tool.get("description") or "",
                "input_schema": tool.get("parameters") or {"type": "object", "properties": {}},
            }
            for tool in request.tools
        ]
    budget = request.config.get("thinking_budget")
    if budget:
        body["thinking"] = {"type": "enabled", "budget_tokens": int(budget)}
    return body


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

    __slots__ = ("_blocks", "_finish", "_next", "_usage", "done")

    def __init__(self) -> None:
        self.done = False
        self._blocks: dict[int, _Block | None] = {}
        """Provider block index → our block (None: a block type we do not surface)."""
        self._next = 0
        self._finish: Finish | None = None
        self._usage: Usage | None = None

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
            self._usage = _usage(_object(frame, "message").get("usage") or {}, None)
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
            self._finish = Finish(_STOP.get(reason, "stop"), stop_reason=reason)

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


def _thinking_defaults(
    config: Mapping[str, Any], effort: str | None, table_max: int | None, model_max: int | None
) -> dict[str, Any]:
    """Fields to fill in: ``thinking_budget`` from the effort, then ``max_tokens``.

    ``model_max`` is the provider's per-model ``max_tokens`` override: like an explicit
    ``max_tokens`` it caps the budget, while the built-in table's value does not.

    Raises:
        ModelError: ``INVALID_OPTION`` for an effort the adapter does not know.
    """
    filled: dict[str, Any] = {}
    explicit = config.get("max_tokens")
    cap = int(explicit) if explicit is not None else model_max
    budget = config.get("thinking_budget")
    if budget is None and effort is not None and effort not in _NO_THINKING:
        if effort not in THINKING_BUDGETS:
            known = ", ".join(THINKING_BUDGETS)
            raise ModelError(
                Failure("INVALID_OPTION", f"unknown reasoning_effort {effort!r} (use {known})")
            )
        budget = THINKING_BUDGETS[effort]
        if cap is not None and budget >= cap:
            budget = cap - 1  # the API wants the budget below the output cap
        if budget >= _MIN_BUDGET:
            filled["thinking_budget"] = budget
        else:
            budget = None  # too small a cap to think at all
    if explicit is None:
        if model_max is not None:
            filled["max_tokens"] = model_max
        elif budget:
            filled["max_tokens"] = int(budget) + _ABOVE_BUDGET
        else:
            filled["max_tokens"] = table_max or _DEFAULT_MAX_TOKENS
    return filled


@final
class AnthropicAdapter:
    """An Anthropic Messages API provider (``kind: anthropic``).

    Args:
        name: The provider (route) name.
        base_url: The API root; requests go to ``{base_url}/v1/messages``.
        api_key_env: The env var holding the key (sent as ``x-api-key``), read at each call;
            None or ``""`` sends no key (a proxy that adds it). A provider built from config
            sends no key unless its section names the variable.
        headers: Extra request headers (for example ``anthropic-beta``).
        timeout: ``(connect, read)`` seconds, ``{connect, read}`` or one number.
        context_window: The provider-wide context window (overrides the table).
        models: Per-model overrides ``{NAME: {context_window, max_tokens, reasoning_effort}}``.
        transport: An httpx transport (tests: ``httpx.MockTransport``).
    """

    def __init__(
        self,
        name: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str | None = "ANTHROPIC_API_KEY",
        headers: Mapping[str, str] | None = None,
        timeout: TimeoutSpec = DEFAULT_TIMEOUT,
        context_window: int | None = None,
        models: Mapping[str, Mapping[str, Any]] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.url = endpoint(base_url, "/v1/messages")
        self.api_key_env = api_key_env
        self._context_window = context_window
        self._models = models
        self._pool = ClientPool(
            headers={"anthropic-version": API_VERSION, **(headers or {})},
            timeout=timeout,
            transport=transport,
        )

    @classmethod
    def from_config(
        cls,
        name: str,
        config: AnthropicProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> AnthropicAdapter:
        """Build from a ``kind: anthropic`` provider record the config layer has validated.

        Args:
            name: The provider (route) name.
            config: The validated record (``load_config(...).providers[name]``); without
                ``api_key_env`` no key is sent.
            transport: An httpx transport for the adapter's client (tests).
        """
        return cls(
            name,
            base_url=config.base_url or DEFAULT_BASE_URL,
            api_key_env=config.api_key_env or None,
            headers=config.headers,
            timeout=(config.timeout.connect, config.timeout.read),
            context_window=config.context_window,
            models={
                model: attrs.asdict(entry, filter=lambda _, value: value is not None)
                for model, entry in config.models.items()
            },
            transport=transport,
        )

    async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
        """Resolve the thinking budget and ``max_tokens`` defaults for ``config``.

        Raises:
            ModelError: ``AUTH`` when the key's env var is unset; ``INVALID_OPTION`` without a
                model or for an unknown reasoning effort.
        """
        read_api_key(self.api_key_env)
        model = config.get("model")
        if not model:
            raise ModelError(Failure("INVALID_OPTION", f"provider {self.name}: no model given"))
        info = resolve_model(str(model), models=self._models, context_window=self._context_window)
        defaults: dict[str, Any] = {}
        effort = config.get("reasoning_effort")
        if effort is None and info.default_effort is not None:
            effort = defaults["reasoning_effort"] = info.default_effort
        if info.reasoning_effort is False:
            effort = None  # a model without extended thinking
        override = (self._models or {}).get(str(model)) or {}
        model_max = override.get("max_tokens")
        table = lookup_model(str(model))
        defaults |= _thinking_defaults(
            config,
            effort,
            table.max_tokens if table else None,
            None if model_max is None else int(model_max),
        )
        effective = {**config, **defaults}

        def stream_fn(request: ModelRequest) -> AsyncIterator[Chunk]:
            return self._stream(request, defaults)

        return PreparedCall(
            config=effective,
            stream_fn=stream_fn,
            adapter_defaults=defaults,
            context_window=info.context_window,
            system_prompt_update=None,
        )

    def _stream(self, request: ModelRequest, defaults: Mapping[str, Any]) -> AsyncIterator[Chunk]:
        try:
            key = read_api_key(self.api_key_env)
        except ModelError as exc:
            return failed_stream(exc.failure)
        body = build_anthropic_request(with_defaults(request, defaults))
        auth = {} if key is None else {"x-api-key": key}
        return post_stream(
            self._pool,
            self.url,
            body,
            auth=auth,
            decoder=AnthropicStreamDecoder(),
            key_env=self.api_key_env,
        )

    async def aclose(self) -> None:
        """Close the pooled client (it is created again if the adapter is used later)."""
        await self._pool.aclose()
