"""Built-in model defaults: context window, output cap, reasoning effort and replay, prompt mode.

The table holds *defaults* only, from the providers' public model pages; a provider's config
overrides them: ``context_window`` and ``reasoning_replay`` for every model of the provider, and
``models: {NAME: {context_window, max_tokens, reasoning_effort, reasoning_replay}}`` per model
(the more specific wins). Lookup is by exact name first, then by the first matching family
pattern, so dated snapshots (``claude-sonnet-4-20250514``) and variants (``gpt-4.1-mini``)
inherit their family.

Reasoning replay is per model because providers disagree in both directions: DeepSeek's
thinking models answer HTTP 400 when an assistant turn with tool calls comes back without its
``reasoning_content`` (``tool-turns``), while ``deepseek-reasoner`` and many OpenAI-compatible
servers answer 400 when the field is present at all (``never``, also the default for models the
table does not know).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Final, Literal, final

import attrs

from ._base import SystemPromptUpdate

__all__ = [
    "BUILTIN_MODELS",
    "REASONING_REPLAY_MODES",
    "ModelInfo",
    "ReasoningReplay",
    "lookup_model",
    "resolve_model",
]

ReasoningReplay = Literal["never", "tool-turns", "always"]
"""When an OpenAI-compatible request carries ``reasoning_content`` on assistant messages:
``never``; ``tool-turns`` (on every assistant message with tool calls, ``""`` when it had no
reasoning, and on no other); ``always`` (on every assistant message)."""
#: The valid ``reasoning_replay`` values.
REASONING_REPLAY_MODES: Final[tuple[ReasoningReplay, ...]] = ("never", "tool-turns", "always")


@final
@attrs.frozen(slots=True)
class ModelInfo:
    """What the runtime assumes about one model."""

    context_window: int | None = None
    """Input + output tokens the model accepts (None: unknown)."""
    max_tokens: int | None = None
    """Output cap filled in when a request sets none (None: leave it to the provider)."""
    reasoning_effort: bool | None = None
    """Whether a ``reasoning_effort`` setting applies (is sent / mapped) for this model; None
    (an unknown model) sends it when a request sets it."""
    default_effort: str | None = None
    """Effort filled in when a request sets none (only from config overrides)."""
    system_prompt_update: SystemPromptUpdate = None
    """``in-history`` when the provider accepts later system messages; None: head only."""
    max_tokens_param: str = "max_tokens"
    """The request field carrying the output cap (OpenAI reasoning models need
    ``max_completion_tokens``)."""
    reasoning_replay: ReasoningReplay = "never"
    """Which assistant messages carry ``reasoning_content`` back (openai adapter)."""


_IN_HISTORY: Final = "in-history"


def _info(
    window: int,
    max_tokens: int | None,
    *,
    effort: bool,
    update: SystemPromptUpdate = None,
    param: str = "max_tokens",
    replay: ReasoningReplay = "never",
) -> ModelInfo:
    return ModelInfo(
        context_window=window,
        max_tokens=max_tokens,
        reasoning_effort=effort,
        system_prompt_update=update,
        max_tokens_param=param,
        reasoning_replay=replay,
    )


#: (pattern, info), first match wins; exact names come before their families.
BUILTIN_MODELS: Final[tuple[tuple[str, ModelInfo], ...]] = (
    # DeepSeek: 128K context; chat caps output at 8K, reasoner at 64K (32K default). The
    # reasoner always thinks and rejects reasoning_content in requests; the V4 thinking models
    # want it back on every assistant turn with tool calls. None takes a reasoning effort.
    ("deepseek-chat", _info(128_000, 8_192, effort=False, update=_IN_HISTORY)),
    ("deepseek-reasoner", _info(128_000, 32_768, effort=False, update=_IN_HISTORY)),
    ("deepseek-v4*", _info(128_000, None, effort=False, update=_IN_HISTORY, replay="tool-turns")),
    ("deepseek-*", _info(128_000, None, effort=False, update=_IN_HISTORY)),
    # OpenAI.
    ("gpt-4o*", _info(128_000, 16_384, effort=False)),
    ("gpt-4.1*", _info(1_047_576, 32_768, effort=False)),
    ("o3*", _info(200_000, None, effort=True, param="max_completion_tokens")),
    ("o4-mini*", _info(200_000, None, effort=True, param="max_completion_tokens")),
    # Anthropic: 200K context; extended thinking from 3.7 Sonnet and the 4 families on.
    ("claude-3-5-sonnet*", _info(200_000, 8_192, effort=False)),
    ("claude-3-5-haiku*", _info(200_000, 8_192, effort=False)),
    ("claude-3-opus*", _info(200_000, 4_096, effort=False)),
    ("claude-3-7-sonnet*", _info(200_000, 8_192, effort=True)),
    ("claude-sonnet-4*", _info(200_000, 8_192, effort=True)),
    ("claude-opus-4*", _info(200_000, 8_192, effort=True)),
    ("claude-haiku-4*", _info(200_000, 8_192, effort=True)),
    ("claude-*", _info(200_000, 8_192, effort=False)),
)


def lookup_model(name: str) -> ModelInfo | None:
    """The built-in defaults for ``name``, or None for a model the table does not know."""
    for pattern, info in BUILTIN_MODELS:
        if name == pattern or fnmatch.fnmatchcase(name, pattern):
            return info
    return None


def resolve_model(
    name: str,
    *,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    context_window: int | None = None,
    reasoning_replay: ReasoningReplay | None = None,
) -> ModelInfo:
    """The effective defaults for ``name``: the table, then the provider's overrides.

    Args:
        name: The model name.
        models: The provider's ``models`` section; ``models[name]`` may set ``context_window``,
            ``max_tokens``, ``reasoning_effort`` (a bool: whether effort applies; a string:
            the default effort, which implies that it applies) and ``reasoning_replay``.
        context_window: The provider-wide ``context_window``.
        reasoning_replay: The provider-wide ``reasoning_replay``.

    Returns:
        The merged ``ModelInfo`` (an unknown model without overrides gets an empty one).
    """
    info = lookup_model(name) or ModelInfo()
    if context_window is not None:
        info = attrs.evolve(info, context_window=context_window)
    if reasoning_replay is not None:
        info = attrs.evolve(info, reasoning_replay=reasoning_replay)
    override = (models or {}).get(name)
    if not override:
        return info
    changes: dict[str, Any] = {}
    if override.get("reasoning_replay") is not None:
        changes["reasoning_replay"] = override["reasoning_replay"]
    if override.get("context_window") is not None:
        changes["context_window"] = int(override["context_window"])
    if override.get("max_tokens") is not None:
        changes["max_tokens"] = int(override["max_tokens"])
    effort = override.get("reasoning_effort")
    if isinstance(effort, bool):
        changes["reasoning_effort"] = effort
    elif isinstance(effort, str):
        changes["reasoning_effort"] = True
        changes["default_effort"] = effort
    return attrs.evolve(info, **changes)
