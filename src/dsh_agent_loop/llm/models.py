"""Built-in model defaults: context window, default output cap, reasoning effort, prompt mode.

The table holds *defaults* only, from the providers' public model pages; a provider's config
overrides them: ``context_window`` for every model of the provider, and
``models: {NAME: {context_window, max_tokens, reasoning_effort}}`` per model (the more specific
wins). Lookup is by exact name first, then by the first matching family pattern, so dated
snapshots (``claude-sonnet-4-20250514``) and variants (``gpt-4.1-mini``) inherit their family.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from .base import SystemPromptUpdate

__all__ = ["BUILTIN_MODELS", "ModelInfo", "lookup_model", "resolve_model"]


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


_IN_HISTORY: Final = "in-history"


def _info(
    window: int,
    max_tokens: int | None,
    *,
    effort: bool,
    update: SystemPromptUpdate = None,
    param: str = "max_tokens",
) -> ModelInfo:
    return ModelInfo(
        context_window=window,
        max_tokens=max_tokens,
        reasoning_effort=effort,
        system_prompt_update=update,
        max_tokens_param=param,
    )


#: (pattern, info), first match wins; exact names come before their families.
BUILTIN_MODELS: Final[tuple[tuple[str, ModelInfo], ...]] = (
    # DeepSeek: 128K context; chat caps output at 8K, reasoner at 64K (32K default). The
    # reasoner always thinks; neither takes a reasoning effort.
    ("deepseek-chat", _info(128_000, 8_192, effort=False, update=_IN_HISTORY)),
    ("deepseek-reasoner", _info(128_000, 32_768, effort=False, update=_IN_HISTORY)),
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
) -> ModelInfo:
    """The effective defaults for ``name``: the table, then the provider's overrides.

    Args:
        name: The model name.
        models: The provider's ``models`` section; ``models[name]`` may set ``context_window``,
            ``max_tokens`` and ``reasoning_effort`` (a bool: whether effort applies; a string:
            the default effort, which implies that it applies).
        context_window: The provider-wide ``context_window``.

    Returns:
        The merged ``ModelInfo`` (an unknown model without overrides gets an empty one).
    """
    info = lookup_model(name) or ModelInfo()
    if context_window is not None:
        info = attrs.evolve(info, context_window=context_window)
    override = (models or {}).get(name)
    if not override:
        return info
    changes: dict[str, Any] = {}
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
