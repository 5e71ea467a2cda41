"""Key names: how each record's attributes are spelled in the file.

The plugin block keeps the seed's camelCase keys (``maxParallelToolCalls``); ``store`` and
``providers`` are snake_case, as the attributes are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from .agents import AgentEntry, LoopConfig, SettingsLayer, TurnBudget
from .providers import PROVIDER_CLASSES, PROVIDER_KEYS

__all__ = ["allowed_keys", "key_names"]

_CAMEL_CLASSES: Final = frozenset({LoopConfig, AgentEntry, TurnBudget, SettingsLayer})


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def key_names(cl: type) -> dict[str, str]:
    """Attribute name → key as written in the file."""
    camel = cl in _CAMEL_CLASSES
    return {a.name: _camel(a.name) if camel else a.name for a in attrs.fields(cl)}


def allowed_keys(cl: type) -> Iterable[str]:
    """The keys an ``unknown key`` fault lists: every provider key for a provider record."""
    return PROVIDER_KEYS if cl in PROVIDER_CLASSES.values() else key_names(cl).values()
