"""Provider objects: a config's provider sections written in Python, and what they build.

``OpenAIProvider`` and ``AnthropicProvider`` are the ``kind: openai`` and ``kind: anthropic``
sections as objects (``open_runtime(providers={"ds": OpenAIProvider(...)})``): built, they are
validated by the config's rules into the record of their kind, and turned into their adapter
through the same path as a config's providers (``_compose.adapter_from_config``). They read
config records and build ``llm`` adapters, so they live beside the composition, above both.

A key given directly (``api_key=``) is a secret: it is left out of ``repr`` and of every
record, and reaches only the adapter's HTTP client, as the request's auth header; the session
log never sees provider settings. Surrounding whitespace is stripped from it, and a key with a
control or non-ASCII character inside is refused (``ValueError``, never quoting it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, final

import attrs
import httpx

from ._compose import adapter_from_config
from ._frozen import FrozenDict, freeze, thaw
from .config import ProviderConfig, load_provider
from .llm import ModelAdapter, ReasoningReplay, StreamLimits

__all__ = ["AnthropicProvider", "OpenAIProvider", "adapters_from_arguments"]


Timeout = float | tuple[float, float] | Mapping[str, float]
"""Seconds: one number for connect and read, ``(connect, read)``, or ``{connect, read}``."""


def _timeout(value: Timeout | None) -> Any:
    if value is None or isinstance(value, Mapping):
        return value
    if isinstance(value, tuple):
        return {"connect": value[0], "read": value[1]} if len(value) == 2 else value
    return {"connect": value, "read": value}


def _limits(value: StreamLimits | Mapping[str, Any] | None) -> Any:
    """``stream_limits`` as given: a ``StreamLimits``, a frozen mapping, or None."""
    return value if value is None or isinstance(value, StreamLimits) else freeze(value)


def _strip(key: str | None) -> str | None:
    return key.strip() if isinstance(key, str) else key


def _section(provider: OpenAIProvider | AnthropicProvider) -> dict[str, Any]:
    """The provider as a config section (the key left out), for the config's rules."""
    section: dict[str, Any] = {"kind": provider.kind}
    for field in attrs.fields(type(provider)):
        value = getattr(provider, field.name)
        if field.name == "api_key" or value is None or value == field.default:
            continue
        if field.name == "timeout":
            value = _timeout(value)
        elif isinstance(value, StreamLimits):
            value = value.changed()
        section[field.name] = thaw(value)
    return section


def _record(provider: OpenAIProvider | AnthropicProvider) -> ProviderConfig:
    """The validated record of ``provider``, its key added as the auth header."""
    record = load_provider(_section(provider), label=type(provider).__name__)
    if provider.api_key is None or record.kind == "scripted":
        return record
    header, value = provider.auth_header, provider.auth_value(provider.api_key)
    if any(name.lower() == header for name in record.headers):
        raise ValueError(f"{type(provider).__name__}: give api_key or a {header} header, not both")
    return attrs.evolve(record, headers=FrozenDict({**record.headers, header: value}))


def _sendable(key: str) -> bool:
    """Whether ``key`` can go in a header as it is: printable ASCII (as the adapters check)."""
    return key.isascii() and key.isprintable()


def _check_key(provider: OpenAIProvider | AnthropicProvider) -> None:
    name = type(provider).__name__
    if provider.api_key is not None and provider.api_key_env is not None:
        raise ValueError(f"{name}: give api_key or api_key_env, not both")
    if provider.api_key is not None and not provider.api_key:
        raise ValueError(f"{name}: api_key is empty")
    if provider.api_key is not None and not _sendable(provider.api_key):
        raise ValueError(f"{name}: api_key holds a control or non-ASCII character")
    _record(provider)  # every other rule: a ConfigError now, not when the runtime opens


@final
@attrs.frozen
class OpenAIProvider:
    """An OpenAI-compatible chat-completions provider (DeepSeek, OpenAI, vLLM, Ollama, ...).

    ``open_runtime(providers={"ds": OpenAIProvider(base_url="https://api.deepseek.com",
    api_key_env="DEEPSEEK_API_KEY")})``. The fields are a config file's ``kind: openai`` keys
    and are checked by the same rules when the object is built.

    Raises:
        ConfigError: a field breaks a config rule (``OpenAIProvider: base_url: ...``).
        ValueError: both ``api_key`` and ``api_key_env``, an empty ``api_key``, or one with
            a control or non-ASCII character.
    """

    kind: ClassVar[Literal["openai"]] = "openai"
    auth_header: ClassVar[str] = "authorization"

    base_url: str | None = None
    """The API root (None: ``https://api.openai.com/v1``); requests go to
    ``{base_url}/chat/completions``."""
    api_key: str | None = attrs.field(default=None, repr=False, converter=_strip)
    """The key itself, stripped (kept out of ``repr`` and of every record and log)."""
    api_key_env: str | None = None
    """The env var holding the key, read at each request (None and no ``api_key``: no key)."""
    headers: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=freeze)
    timeout: Timeout | None = None
    """None: connect 10 s, read 300 s."""
    stream_limits: StreamLimits | Mapping[str, Any] | None = attrs.field(
        default=None, converter=_limits
    )
    """Bounds on each stream: a ``StreamLimits`` or the config's ``stream_limits`` mapping
    (None: the defaults)."""
    stream_usage: bool = True
    system_prompt_update: Literal["in-history", "head"] | None = None
    context_window: int | None = None
    reasoning_replay: ReasoningReplay | None = None
    models: Mapping[str, Mapping[str, Any]] = attrs.field(factory=FrozenDict, converter=freeze)
    """Per-model overrides: ``{NAME: {context_window, max_tokens, reasoning_effort,
    reasoning_replay}}``."""

    def __attrs_post_init__(self) -> None:
        _check_key(self)

    @staticmethod
    def auth_value(key: str) -> str:
        """The auth header's value for ``key``."""
        return f"Bearer {key}"

    def adapter(
        self, name: str, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> ModelAdapter:
        """The adapter serving this provider as route ``name`` (what ``open_runtime`` does)."""
        return adapter_from_config(name, _record(self), transport=transport)


@final
@attrs.frozen
class AnthropicProvider:
    """An Anthropic Messages API provider.

    ``open_runtime(providers={"claude": AnthropicProvider(api_key_env="ANTHROPIC_API_KEY")})``.
    The fields are a config file's ``kind: anthropic`` keys, checked by the same rules when the
    object is built.

    Raises:
        ConfigError: a field breaks a config rule (``AnthropicProvider: base_url: ...``).
        ValueError: both ``api_key`` and ``api_key_env``, an empty ``api_key``, or one with
            a control or non-ASCII character.
    """

    kind: ClassVar[Literal["anthropic"]] = "anthropic"
    auth_header: ClassVar[str] = "x-api-key"

    base_url: str | None = None
    """The API root (None: ``https://api.anthropic.com``); requests go to
    ``{base_url}/v1/messages``."""
    api_key: str | None = attrs.field(default=None, repr=False, converter=_strip)
    """The key itself, stripped (kept out of ``repr`` and of every record and log)."""
    api_key_env: str | None = None
    """The env var holding the key, read at each request (None and no ``api_key``: no key)."""
    headers: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=freeze)
    timeout: Timeout | None = None
    """None: connect 10 s, read 300 s."""
    stream_limits: StreamLimits | Mapping[str, Any] | None = attrs.field(
        default=None, converter=_limits
    )
    """Bounds on each stream: a ``StreamLimits`` or the config's ``stream_limits`` mapping
    (None: the defaults)."""
    system_prompt_update: Literal["head"] | None = None
    context_window: int | None = None
    models: Mapping[str, Mapping[str, Any]] = attrs.field(factory=FrozenDict, converter=freeze)
    """Per-model overrides: ``{NAME: {context_window, max_tokens, reasoning_effort}}``."""

    def __attrs_post_init__(self) -> None:
        _check_key(self)

    @staticmethod
    def auth_value(key: str) -> str:
        """The auth header's value for ``key``."""
        return key

    def adapter(
        self, name: str, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> ModelAdapter:
        """The adapter serving this provider as route ``name`` (what ``open_runtime`` does)."""
        return adapter_from_config(name, _record(self), transport=transport)


def adapters_from_arguments(
    providers: Mapping[str, ModelAdapter | OpenAIProvider | AnthropicProvider],
) -> dict[str, ModelAdapter]:
    """``open_runtime(providers=...)``: adapters as given, provider objects built."""
    return {
        name: p.adapter(name) if isinstance(p, OpenAIProvider | AnthropicProvider) else p
        for name, p in providers.items()
    }
