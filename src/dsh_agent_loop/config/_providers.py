"""Provider config: the ``providers`` section as one tagged union over ``kind``.

Each kind has its own record (``openai``, ``anthropic``, ``scripted``) holding only the keys that
kind reads, so an adapter is built from a validated record and never checks a key again. The
union is structured by ``kind``; a key that belongs to another kind is reported by the rules
below (``only valid for kind 'scripted'``), not as an unknown key, and an unknown key lists every
provider key, whatever the kind.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal, TypeAlias, final

import attrs

from .._frozen import FrozenDict, freeze
from ._rules import (
    PROVIDER_KINDS,
    Fault,
    NonEmptyStr,
    NonNegativeNumber,
    PositiveInt,
    PositiveNumber,
    ReasoningReplay,
    frozen_map,
    to_tuple,
)

__all__ = [
    "PROVIDER_KEYS",
    "AnthropicProviderConfig",
    "ModelConfig",
    "OpenAIProviderConfig",
    "ProviderConfig",
    "ScriptedProviderConfig",
    "ScriptedReplyConfig",
    "ScriptedToolCallConfig",
    "StreamLimitsConfig",
    "TimeoutConfig",
    "provider_faults",
]


@final
@attrs.frozen
class TimeoutConfig:
    """HTTP timeouts of one provider, in seconds."""

    connect: PositiveNumber = 10.0
    read: PositiveNumber = 300.0


@final
@attrs.frozen
class StreamLimitsConfig:
    """Bounds on one provider's streams (``stream_limits``); None: the adapter's default.

    The defaults and what happens past each bound are ``StreamLimits``' (``llm/_stream_limits.py``):
    4 MiB a line, 8 MiB an event, 2,000,000 characters of output, idle for the read timeout.
    """

    max_line_bytes: PositiveInt | None = None
    max_event_bytes: PositiveInt | None = None
    max_output_chars: PositiveInt | None = None
    idle_timeout: PositiveNumber | None = None
    """Seconds without a chunk (None: the provider's ``timeout.read``)."""


@final
@attrs.frozen
class ModelConfig:
    """Per-model overrides under a provider's ``models``."""

    context_window: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    reasoning_effort: NonEmptyStr | None = None
    reasoning_replay: ReasoningReplay | None = None
    """openai: which assistant messages carry ``reasoning_content`` (None: the provider's
    setting, else the built-in model table)."""


@final
@attrs.frozen
class ScriptedToolCallConfig:
    """A tool call in a scripted reply."""

    name: NonEmptyStr
    arguments: Mapping[str, Any] = attrs.field(factory=FrozenDict, converter=freeze)


@final
@attrs.frozen
class ScriptedReplyConfig:
    """One reply of a scripted provider."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ScriptedToolCallConfig, ...] = attrs.field(default=(), converter=to_tuple)


@final
@attrs.frozen
class OpenAIProviderConfig:
    """A ``kind: openai`` provider: an OpenAI-compatible chat-completions endpoint."""

    kind: Literal["openai"] = "openai"
    base_url: NonEmptyStr | None = None
    """None: ``https://api.openai.com/v1``."""
    api_key_env: str | None = None
    """The env var holding the key; absent, null or ``""``: no key is sent (keyless servers)."""
    headers: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=frozen_map)
    timeout: TimeoutConfig = attrs.field(factory=TimeoutConfig)
    stream_limits: StreamLimitsConfig = attrs.field(factory=StreamLimitsConfig)
    stream_usage: bool = True
    system_prompt_update: Literal["in-history", "head"] | None = None
    """None: from the built-in model table (``deepseek-*`` → ``in-history``, else head)."""
    context_window: PositiveInt | None = None
    reasoning_replay: ReasoningReplay | None = None
    """``never`` | ``tool-turns`` | ``always`` for every model (None: the model table)."""
    models: Mapping[str, ModelConfig] = attrs.field(factory=FrozenDict, converter=frozen_map)


@final
@attrs.frozen
class AnthropicProviderConfig:
    """A ``kind: anthropic`` provider: the Messages API."""

    kind: Literal["anthropic"] = "anthropic"
    base_url: NonEmptyStr | None = None
    """None: ``https://api.anthropic.com``."""
    api_key_env: str | None = None
    """The env var holding the key; absent, null or ``""``: no key is sent."""
    headers: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=frozen_map)
    timeout: TimeoutConfig = attrs.field(factory=TimeoutConfig)
    stream_limits: StreamLimitsConfig = attrs.field(factory=StreamLimitsConfig)
    system_prompt_update: Literal["in-history", "head"] | None = None
    """Only ``head`` (or None): Anthropic takes one system prompt."""
    context_window: PositiveInt | None = None
    models: Mapping[str, ModelConfig] = attrs.field(factory=FrozenDict, converter=frozen_map)


@final
@attrs.frozen
class ScriptedProviderConfig:
    """A ``kind: scripted`` provider: ``ScriptedModel`` answering from ``replies``."""

    kind: Literal["scripted"] = "scripted"
    system_prompt_update: Literal["in-history", "head"] | None = None
    context_window: PositiveInt | None = None
    replies: tuple[ScriptedReplyConfig, ...] = attrs.field(default=(), converter=to_tuple)
    latency_ms: NonNegativeNumber = 0.0
    """Delay before each chunk."""
    loop: bool = False
    """Cycle the script."""


ProviderConfig: TypeAlias = OpenAIProviderConfig | AnthropicProviderConfig | ScriptedProviderConfig
"""One entry of the ``providers`` section: the record of its ``kind``."""

#: The record of each kind, the union's tags.
PROVIDER_CLASSES: Final[Mapping[str, type[ProviderConfig]]] = FrozenDict(
    openai=OpenAIProviderConfig, anthropic=AnthropicProviderConfig, scripted=ScriptedProviderConfig
)
#: Every provider key, in the order an ``unknown key`` fault lists them.
PROVIDER_KEYS: Final = (
    "kind",
    "base_url",
    "api_key_env",
    "headers",
    "timeout",
    "stream_limits",
    "stream_usage",
    "system_prompt_update",
    "context_window",
    "reasoning_replay",
    "models",
    "replies",
    "latency_ms",
    "loop",
)
#: Keys valid only for one provider kind (``scripted`` vs the HTTP kinds).
_SCRIPTED_ONLY: Final = ("replies", "latency_ms", "loop")
_HTTP_ONLY: Final = (
    "base_url",
    "api_key_env",
    "headers",
    "timeout",
    "stream_limits",
    "stream_usage",
    "models",
    "reasoning_replay",
)
_OPENAI_ONLY: Final = ("stream_usage", "reasoning_replay")
"""Valid only for kind ``openai`` (``reasoning_replay`` in its ``models`` entries too)."""


def _snake(key: Any) -> Any:
    """A written key in snake_case (``baseUrl`` → ``base_url``); other values as they are."""
    if not isinstance(key, str) or key.islower():
        return key
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(key))


def _written(section: Mapping[Any, Any], key: str) -> Any:
    """How ``key`` is written in a raw section (either spelling), or ``key`` when absent."""
    return next((k for k in section if _snake(k) == key), key)


def _get(section: Mapping[Any, Any], key: str) -> Any:
    """The value of ``key`` in a raw section, in whichever spelling it is written."""
    return section.get(_written(section, key))


def provider_faults(providers: Mapping[Any, Any]) -> Iterator[Fault]:
    """Rules of the ``providers`` section that depend on ``kind``, on the raw tree.

    Keys are matched in either spelling (``baseUrl`` is ``base_url``); paths name the key as
    written.
    """
    for name, provider in providers.items():
        if not isinstance(provider, Mapping):
            continue
        kind = provider.get("kind")
        wrong: tuple[str, ...]
        if kind == "scripted":
            wrong, why = _HTTP_ONLY, "not valid for kind 'scripted'"
        elif kind in PROVIDER_KINDS:
            wrong, why = _SCRIPTED_ONLY, "only valid for kind 'scripted'"
        else:
            continue
        for key in provider:
            if _snake(key) in wrong:
                yield ("providers", str(name), key), why
        if kind != "scripted":
            yield from _http_faults(str(name), provider)
        if kind == "anthropic":
            yield from _anthropic_faults(str(name), provider)


def _http_faults(name: str, provider: Mapping[Any, Any]) -> Iterator[Fault]:
    """``base_url`` and ``headers`` of an HTTP provider; messages never quote their values."""
    base_url = _get(provider, "base_url")
    if isinstance(base_url, str):
        url_path = ("providers", name, _written(provider, "base_url"))
        if _has_userinfo(base_url):
            yield url_path, "must not carry a user name or password (user:pass@); use api_key_env"
        elif not _is_http_url(base_url):
            yield url_path, "must be an http:// or https:// URL"
    headers = _get(provider, "headers")
    if isinstance(headers, Mapping):
        for header, value in headers.items():
            path = ("providers", name, _written(provider, "headers"), str(header))
            if isinstance(header, str) and not _HEADER_NAME.fullmatch(header):
                yield path, "is not a valid HTTP header name"
            elif isinstance(value, str) and not (value.isascii() and value.isprintable()):
                yield path, "must be printable ASCII text (no control characters or line breaks)"


#: An HTTP header name (RFC 9110 ``token``).
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _has_userinfo(url: str) -> bool:
    """Whether ``url`` names a user (``user:pass@host``): httpx would send it as Basic auth."""
    try:
        return "@" in urllib.parse.urlsplit(url).netloc
    except ValueError:
        return "@" in url


def _is_http_url(url: str) -> bool:
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.hostname)


def _anthropic_faults(name: str, provider: Mapping[Any, Any]) -> Iterator[Fault]:
    why = "only valid for kind 'openai'"
    for key in provider:
        if _snake(key) in _OPENAI_ONLY:
            yield ("providers", name, key), why
        elif _snake(key) == "system_prompt_update" and provider[key] == "in-history":
            yield ("providers", name, key), "anthropic takes one system prompt: 'head'"
    models = _get(provider, "models")
    if isinstance(models, Mapping):
        for model, entry in models.items():
            for key in entry if isinstance(entry, Mapping) else ():
                if _snake(key) == "reasoning_replay":
                    yield ("providers", name, "models", str(model), key), why
