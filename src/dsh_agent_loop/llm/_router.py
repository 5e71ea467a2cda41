"""Routes a request config to the adapter registered under its ``provider`` name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

from ._base import Failure, ModelAdapter, ModelError, PreparedCall

__all__ = ["ModelRouter"]


@final
class ModelRouter:
    """Adapters by provider name; an unrouted provider fails with ``NO_ADAPTER``."""

    def __init__(self, adapters: Mapping[str, ModelAdapter] | None = None) -> None:
        self._adapters: dict[str, ModelAdapter] = dict(adapters or {})

    def register(self, name: str, adapter: ModelAdapter) -> None:
        """Route ``name`` to ``adapter`` (replacing any earlier one)."""
        self._adapters[name] = adapter

    def get(self, name: str) -> ModelAdapter | None:
        """The adapter for ``name``, or None."""
        return self._adapters.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Routed provider names."""
        return tuple(self._adapters)

    async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
        """Prepare ``config`` on its provider's adapter.

        Raises:
            ModelError: ``NO_ADAPTER`` when no adapter serves the provider, or the adapter's error.
        """
        provider = config.get("provider")
        adapter = self._adapters.get(str(provider)) if provider is not None else None
        if adapter is None:
            raise ModelError(
                Failure("NO_ADAPTER", f"no adapter is registered for provider {provider!r}")
            )
        return await adapter.prepare_call(config)

    async def aclose(self) -> None:
        """Close every adapter (each at most once, even when routed under several names)."""
        seen: set[int] = set()
        for adapter in self._adapters.values():
            if id(adapter) in seen:
                continue
            seen.add(id(adapter))
            close = getattr(adapter, "aclose", None)
            if close is not None:
                await close()
