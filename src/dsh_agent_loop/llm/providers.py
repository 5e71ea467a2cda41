"""Builds HTTP model adapters from a ``providers.NAME`` config section (SPEC §16).

Only the kinds served over HTTP are built here (``openai``, ``anthropic``); any other kind —
``scripted`` included — raises ``ValueError`` so the caller can handle it. Errors read
``providers.NAME.key: message``, ready to be prefixed with the config file's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import httpx

from ._http import DEFAULT_TIMEOUT
from .anthropic import DEFAULT_BASE_URL as ANTHROPIC_BASE_URL
from .anthropic import AnthropicAdapter
from .base import ModelAdapter
from .models import REASONING_REPLAY_MODES, ReasoningReplay
from .openai import DEFAULT_BASE_URL as OPENAI_BASE_URL
from .openai import OpenAIAdapter

__all__ = ["HTTP_KINDS", "adapter_from_config"]

#: Provider kinds this module builds.
HTTP_KINDS: Final = frozenset({"openai", "anthropic"})

_COMMON: Final = frozenset(
    {"kind", "base_url", "api_key_env", "headers", "timeout", "context_window", "models"}
)
_KEYS: Final = {
    "openai": _COMMON | {"stream_usage", "system_prompt_update", "reasoning_replay"},
    "anthropic": _COMMON | {"system_prompt_update"},
}
_COMMON_MODEL_KEYS: Final = frozenset({"context_window", "max_tokens", "reasoning_effort"})
_MODEL_KEYS: Final = {
    "openai": _COMMON_MODEL_KEYS | {"reasoning_replay"},
    "anthropic": _COMMON_MODEL_KEYS,
}
_UPDATE_MODES: Final = ("in-history", "head", None)


class _Checker:
    """Type checks with ``providers.NAME.key`` paths in the errors."""

    def __init__(self, name: str) -> None:
        self.prefix = f"providers.{name}"

    def fail(self, path: str, message: str) -> ValueError:
        return ValueError(f"{self.prefix}.{path}: {message}")

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, "must be a non-empty string")
        return value

    def positive(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(path, "must be a positive integer")
        return value

    def seconds(self, value: Any, path: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fail(path, "must be a positive number of seconds")
        return float(value)

    def replay(self, value: Any, path: str) -> ReasoningReplay:
        for mode in REASONING_REPLAY_MODES:
            if value == mode and type(value) is str:
                return mode
        raise self.fail(path, f"must be one of {', '.join(REASONING_REPLAY_MODES)}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(path, "must be a mapping")
        return value

    def unknown(self, value: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
        for key in value:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                raise self.fail(where, "unknown key")


def _timeout(check: _Checker, value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = check.seconds(value, "timeout")
        return seconds, seconds
    section = check.mapping(value, "timeout")
    check.unknown(section, frozenset({"connect", "read"}), "timeout")
    return (
        check.seconds(section.get("connect", DEFAULT_TIMEOUT[0]), "timeout.connect"),
        check.seconds(section.get("read", DEFAULT_TIMEOUT[1]), "timeout.read"),
    )


def _models(check: _Checker, value: Any, kind: str) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for model, entry in check.mapping(value, "models").items():
        path = f"models.{model}"
        entry = check.mapping(entry, path)
        check.unknown(entry, _MODEL_KEYS[kind], path)
        if entry.get("reasoning_replay") is not None:
            check.replay(entry["reasoning_replay"], f"{path}.reasoning_replay")
        for key in ("context_window", "max_tokens"):
            if entry.get(key) is not None:
                check.positive(entry[key], f"{path}.{key}")
        effort = entry.get("reasoning_effort")
        if effort is not None and not isinstance(effort, bool | str):
            raise check.fail(f"{path}.reasoning_effort", "must be a boolean or an effort name")
        out[str(model)] = entry
    return out


def _common(
    check: _Checker, config: Mapping[str, Any], kind: str, default_url: str
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "base_url": check.string(config.get("base_url", default_url), "base_url"),
    }
    try:
        url = httpx.URL(kwargs["base_url"])
    except httpx.InvalidURL as exc:
        raise check.fail("base_url", str(exc)) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise check.fail("base_url", "must be an http:// or https:// URL")
    # Absent, null and "" all mean "send no key" (a config file cannot tell null from absent).
    env = config.get("api_key_env")
    kwargs["api_key_env"] = check.string(env, "api_key_env") if env not in (None, "") else None
    if config.get("headers") is not None:
        headers = check.mapping(config["headers"], "headers")
        for key, value in headers.items():
            check.string(value, f"headers.{key}")
        kwargs["headers"] = dict(headers)
    if config.get("timeout") is not None:
        kwargs["timeout"] = _timeout(check, config["timeout"])
    if config.get("context_window") is not None:
        kwargs["context_window"] = check.positive(config["context_window"], "context_window")
    if config.get("models") is not None:
        kwargs["models"] = _models(check, config["models"], kind)
    return kwargs


def adapter_from_config(
    name: str,
    config: Mapping[str, Any],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ModelAdapter:
    """Build the adapter for provider ``name`` from its config section.

    Args:
        name: The provider (route) name.
        config: The section: ``kind`` (``openai`` | ``anthropic``), ``base_url``,
            ``api_key_env`` (absent, null or ``""``: no key is sent), ``headers``,
            ``timeout: {connect, read}``, ``stream_usage`` (openai), ``system_prompt_update``,
            ``context_window``, ``reasoning_replay`` (openai),
            ``models: {NAME: {context_window, max_tokens, reasoning_effort,
            reasoning_replay (openai)}}``.
        transport: An httpx transport for the adapter's client (tests).

    Returns:
        An ``OpenAIAdapter`` or ``AnthropicAdapter``.

    Raises:
        ValueError: an unknown kind (``scripted`` too: the caller builds those), an unknown
            key or a value of the wrong type.
    """
    check = _Checker(name)
    kind = config.get("kind")
    if kind not in HTTP_KINDS:
        raise check.fail("kind", f"unknown provider kind {kind!r} (expected openai or anthropic)")
    check.unknown(config, _KEYS[kind], "")
    update = config.get("system_prompt_update")
    if update not in _UPDATE_MODES:
        raise check.fail("system_prompt_update", "must be 'in-history' or 'head'")
    if kind == "anthropic":
        if update == "in-history":
            raise check.fail("system_prompt_update", "anthropic takes one system prompt: 'head'")
        return AnthropicAdapter(
            name, **_common(check, config, kind, ANTHROPIC_BASE_URL), transport=transport
        )
    kwargs = _common(check, config, kind, OPENAI_BASE_URL)
    if "stream_usage" in config:
        if not isinstance(config["stream_usage"], bool):
            raise check.fail("stream_usage", "must be a boolean")
        kwargs["stream_usage"] = config["stream_usage"]
    if update is not None:  # absent or null: the model table decides
        kwargs["system_prompt_update"] = update
    if config.get("reasoning_replay") is not None:
        kwargs["reasoning_replay"] = check.replay(config["reasoning_replay"], "reasoning_replay")
    return OpenAIAdapter(name, **kwargs, transport=transport)
