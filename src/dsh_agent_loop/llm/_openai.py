"""The ``openai`` adapter: OpenAI-compatible chat completions streamed over SSE.

Serves OpenAI, DeepSeek (``reasoning_content``), vLLM, Ollama and llama.cpp. Design notes:

* Requests are built from derived messages: every non-empty system node stays where it is (so
  in-history mode keeps later system messages in place), assistant messages carry
  ``tool_calls``, tool results become ``role: tool`` messages. Reasoning goes back as
  ``reasoning_content`` only as the model's ``reasoning_replay`` policy says (``models.py``):
  DeepSeek's thinking models need it on tool-call turns, other servers reject the field.
* The stream is normalised frame by frame by ``OpenAIStreamDecoder`` (pure, benchmarkable; in
  ``_openai_stream.py``): text (a string, or a list of typed parts of which text parts count),
  refusal text and reasoning open blocks as they start, tool calls are keyed by their ``index`` and
  open a block when first seen. Nothing marks the end of one call, so block ends are emitted at the
  finish frame; on ``length`` only calls whose arguments parse as JSON are ended, so a call cut by
  the output cap is dropped by the assembler. Usage follows the finish frame, so the ``finish``
  chunk is held until ``[DONE]`` (or the end of the body). Several servers end with ``[DONE]`` and
  no finish reason: after content that is a complete answer, not a cut stream.
* Every value read from a frame is type-checked before it becomes a chunk: a frame the decoder
  cannot read raises ``ValueError``, which the pump reports as a ``BAD_STREAM`` attempt failure
  (a malformed chunk must never reach the turn machine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, final

import httpx

from ._base import (
    Chunk,
    Failure,
    ModelError,
    ModelRequest,
    PreparedCall,
    SystemPromptUpdate,
)
from ._http import (
    DEFAULT_TIMEOUT,
    ClientPool,
    TimeoutSpec,
    endpoint,
    failed_stream,
    post_stream,
    read_api_key,
    resolve_limits,
    with_defaults,
)
from ._models import REASONING_REPLAY_MODES, ModelInfo, ReasoningReplay, resolve_model
from ._openai_stream import OpenAIStreamDecoder
from ._secrets import secret_forms
from ._stream_limits import StreamLimits

__all__ = [
    "OpenAIAdapter",
    "OpenAIStreamDecoder",
    "build_openai_request",
    "openai_messages",
]

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"


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
        stream_limits: Bounds on each stream (None: ``StreamLimits()``; an unset
            ``idle_timeout`` is the read timeout).
        stream_usage: Ask for usage in the stream (``stream_options.include_usage``).
        system_prompt_update: ``in-history``, ``head``/None, or ``auto`` (the model table).
        context_window: The provider-wide context window (overrides the table).
        reasoning_replay: ``never``, ``tool-turns`` or ``always`` for every model of the
            provider (None: the model table, ``never`` for unknown models).
        models: Per-model overrides
            ``{NAME: {context_window, max_tokens, reasoning_effort, reasoning_replay}}``.
        transport: An httpx transport (tests: ``httpx.MockTransport``).

    Raises:
        ValueError: an invalid ``system_prompt_update`` or ``reasoning_replay``, a ``base_url``
            with a user name or password, or a header that cannot be sent.
    """

    def __init__(
        self,
        name: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: TimeoutSpec = DEFAULT_TIMEOUT,
        stream_limits: StreamLimits | None = None,
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
        self._limits = resolve_limits(stream_limits, self._pool.read_timeout)
        self._header_secrets = secret_forms((headers or {}).values())

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
            limits=self._limits,
            secrets=self._secrets(key),
            decoder=OpenAIStreamDecoder(),
            key_env=self.api_key_env,
        )

    def _secrets(self, key: str | None) -> tuple[str, ...]:
        """What no failure message may show: the key and the configured header values."""
        return (
            self._header_secrets if key is None else (*secret_forms([key]), *self._header_secrets)
        )

    @property
    def stream_limits(self) -> StreamLimits:
        """The bounds each stream is read within (``idle_timeout`` resolved)."""
        return self._limits

    async def aclose(self) -> None:
        """Close the pooled client (it is created again if the adapter is used later)."""
        await self._pool.aclose()
