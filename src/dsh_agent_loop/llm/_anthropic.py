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
* The stream (``AnthropicStreamDecoder``, in ``_anthropic_stream.py``) maps content blocks to
  chunk blocks by first appearance. A ``tool_use`` block ends at ``content_block_stop`` only
  when its arguments parse: a call cut by ``max_tokens`` stays unended and is dropped by the
  assembler, while a normal finish completes every block anyway.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, final

import httpx

from ._anthropic_stream import AnthropicStreamDecoder
from ._base import Chunk, Failure, ModelError, ModelRequest, PreparedCall
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
from ._models import lookup_model, resolve_model
from ._secrets import secret_forms
from ._stream_limits import StreamLimits

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
        stream_limits: Bounds on each stream (None: ``StreamLimits()``; an unset
            ``idle_timeout`` is the read timeout).
        context_window: The provider-wide context window (overrides the table).
        models: Per-model overrides ``{NAME: {context_window, max_tokens, reasoning_effort}}``.
        transport: An httpx transport (tests: ``httpx.MockTransport``).

    Raises:
        ValueError: a ``base_url`` with a user name or password, or a header that cannot be
            sent.
    """

    def __init__(
        self,
        name: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str | None = "ANTHROPIC_API_KEY",
        headers: Mapping[str, str] | None = None,
        timeout: TimeoutSpec = DEFAULT_TIMEOUT,
        stream_limits: StreamLimits | None = None,
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
        self._limits = resolve_limits(stream_limits, self._pool.read_timeout)
        self._header_secrets = secret_forms((headers or {}).values())

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
            limits=self._limits,
            secrets=self._secrets(key),
            decoder=AnthropicStreamDecoder(),
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
