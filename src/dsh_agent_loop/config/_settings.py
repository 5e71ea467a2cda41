"""Live settings: four layers read through on every access.

Highest first: explicit keyword arguments, the user layer (replaceable live), the plugin config,
the defaults. Each read resolves the layers again, so a new user layer applies to the next tool
batch without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

from .._errors import ConfigError
from ._agents import LoopConfig, SettingsLayer, TurnBudget
from ._converter import structure
from ._faults import raise_faults
from ._rules import kind_name

__all__ = ["DEFAULT_MAX_PARALLEL_TOOL_CALLS", "Settings", "SettingsLayer", "settings_layer"]

#: ``maxParallelToolCalls`` when no layer sets it.
DEFAULT_MAX_PARALLEL_TOOL_CALLS: Final = 10


def settings_layer(raw: Any, label: str) -> SettingsLayer:
    """A settings layer from a mapping with the plugin block's keys (or a layer, or None).

    Raises:
        ConfigError: ``LABEL: key.path: message`` for each fault.
    """
    if isinstance(raw, SettingsLayer):
        return raw
    if raw is None:
        return SettingsLayer()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{label}: expected a mapping at the top level, got {kind_name(raw)}")
    layer, faults = structure(raw, SettingsLayer)
    raise_faults(faults, raw, label)
    assert isinstance(layer, SettingsLayer)
    return layer


def _explicit_layer(
    max_parallel_tool_calls: int | None, turn_budget: TurnBudget | None, persona: str | None
) -> SettingsLayer:
    value = max_parallel_tool_calls
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError("<arguments>: max_parallel_tool_calls: must be a positive integer")
    return SettingsLayer(max_parallel_tool_calls=value, persona=persona, turn_budget=turn_budget)


@final
class Settings:
    """Settings read live through layers: defaults < plugin config < user layer < explicit.

    A value set in a higher layer wins as a whole (a user ``turnBudget`` replaces the plugin's,
    it is not merged field by field). Every read resolves the layers again, so
    ``update_user_layer`` applies to the next read without a restart.
    """

    __slots__ = ("_explicit", "_plugin", "_resolved", "_user")

    def __init__(
        self,
        plugin: LoopConfig | SettingsLayer | None = None,
        user: Mapping[str, Any] | SettingsLayer | None = None,
        *,
        max_parallel_tool_calls: int | None = None,
        turn_budget: TurnBudget | None = None,
        persona: str | None = None,
    ) -> None:
        """Stack the layers.

        Args:
            plugin: the plugin config block (its ``agents`` are ignored here).
            user: the user layer, a mapping with the plugin block's camelCase keys.
            max_parallel_tool_calls: explicit value; wins over every layer.
            turn_budget: explicit default turn budget.
            persona: explicit runtime persona.

        Raises:
            ConfigError: the user layer or an explicit value is invalid.
        """
        if isinstance(plugin, LoopConfig):
            plugin = SettingsLayer(
                max_parallel_tool_calls=plugin.max_parallel_tool_calls,
                persona=plugin.persona,
                turn_budget=plugin.turn_budget,
            )
        self._plugin: SettingsLayer = plugin or SettingsLayer()
        self._user: SettingsLayer = settings_layer(user, "<settings>")
        self._explicit = _explicit_layer(max_parallel_tool_calls, turn_budget, persona)
        # Resolved values (layers are frozen; only update_user_layer changes the answer).
        self._resolved: dict[str, Any] = {}

    @property
    def user_layer(self) -> SettingsLayer:
        """The current user layer."""
        return self._user

    def update_user_layer(self, mapping: Mapping[str, Any] | SettingsLayer | None) -> None:
        """Replace the user layer (None clears it); the old layer stays if the new one is bad.

        Raises:
            ConfigError: ``<settings>: key.path: message`` for each fault.
        """
        self._user = settings_layer(mapping, "<settings>")
        self._resolved = {}

    def _get(self, name: str) -> Any:
        resolved = self._resolved
        if name in resolved:
            return resolved[name]
        found = None
        for layer in (self._explicit, self._user, self._plugin):
            value = getattr(layer, name)
            if value is not None:
                found = value
                break
        resolved[name] = found
        return found

    @property
    def max_parallel_tool_calls(self) -> int:
        """Parallel-safe tool calls in flight per step (default 10; 1 = serial)."""
        value: int | None = self._get("max_parallel_tool_calls")
        return DEFAULT_MAX_PARALLEL_TOOL_CALLS if value is None else value

    @property
    def turn_budget(self) -> TurnBudget | None:
        """The default turn budget of agents that declare none."""
        value: TurnBudget | None = self._get("turn_budget")
        return value

    @property
    def persona(self) -> str | None:
        """The runtime persona."""
        value: str | None = self._get("persona")
        return value

    def __repr__(self) -> str:
        return (
            f"Settings(max_parallel_tool_calls={self.max_parallel_tool_calls!r}, "
            f"turn_budget={self.turn_budget!r}, persona={self.persona!r})"
        )
