"""Builds the model adapter of one validated ``providers.NAME`` record (SPEC §15, §16).

The config layer validates a provider section once, into the record of its ``kind``; this
module only picks the adapter class for that kind and calls its ``from_config``. Nothing here
reads a raw mapping, so nothing here validates again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import httpx

from .anthropic import AnthropicAdapter
from .base import ModelAdapter
from .openai import OpenAIAdapter
from .scripted import ScriptedModel

if TYPE_CHECKING:
    from ..config import ProviderConfig

__all__ = ["HTTP_KINDS", "adapter_from_config"]

#: Provider kinds served over HTTP.
HTTP_KINDS: Final = frozenset({"openai", "anthropic"})


def adapter_from_config(
    name: str,
    config: ProviderConfig,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ModelAdapter:
    """Build the adapter for provider ``name`` from its validated record.

    Args:
        name: The provider (route) name.
        config: A record from ``load_config(...).providers`` (``OpenAIProviderConfig``,
            ``AnthropicProviderConfig`` or ``ScriptedProviderConfig``), never a raw mapping.
        transport: An httpx transport for an HTTP adapter's client (tests).

    Returns:
        An ``OpenAIAdapter``, ``AnthropicAdapter`` or ``ScriptedModel``.

    Raises:
        TypeError: ``config`` is a raw mapping, not a validated provider record.
    """
    if isinstance(config, Mapping):  # a raw section: validate it with load_config first
        raise TypeError(f"providers.{name}: expected a validated provider record, not a mapping")
    if config.kind == "openai":
        return OpenAIAdapter.from_config(name, config, transport=transport)
    if config.kind == "anthropic":
        return AnthropicAdapter.from_config(name, config, transport=transport)
    return ScriptedModel.from_config(config)
