"""Key names: how each record's attributes are spelled in the file, and the other spelling.

The plugin block keeps the camelCase keys the TypeScript package spells (``maxParallelToolCalls``;
docs/design.md#file-shape), under the ``plugins`` wrapper or at the top level; ``store`` and
``providers`` are snake_case, as the attributes are. Either spelling is read everywhere
(``max_parallel_tool_calls``, ``baseUrl``), one per key in a mapping; messages and
``unstructure`` use the record's own spelling, and an unknown key is answered with the closest
known one.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ._agents import AgentEntry, LoopConfig, SettingsLayer, SubagentEntry, TurnBudget
from ._compaction import CompactionConfig
from ._document import FileShape
from ._fleet import FleetConfig
from ._providers import PROVIDER_CLASSES, PROVIDER_KEYS
from ._rules import Invalid
from ._tracing import OtelConfig

__all__ = ["allowed_keys", "camel", "closest_key", "key_names", "respell", "snake", "spelled"]

_CAMEL_CLASSES: Final = frozenset(
    {
        LoopConfig,
        AgentEntry,
        SubagentEntry,
        TurnBudget,
        SettingsLayer,
        OtelConfig,
        FleetConfig,
        FileShape,
        CompactionConfig,
    }
)
_UPPER: Final = re.compile(r"(?<=[a-z0-9])([A-Z])")


def camel(name: str) -> str:
    """``snake_case`` → ``camelCase`` (a camelCase name is returned as is)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def snake(name: str) -> str:
    """``camelCase`` → ``snake_case`` (a snake_case name is returned as is)."""
    return _UPPER.sub(r"_\1", name).lower() if not name.islower() else name


def key_names(cl: type) -> dict[str, str]:
    """Attribute name → key as written in the file (the record's own spelling)."""
    is_camel = cl in _CAMEL_CLASSES
    return {a.name: camel(a.name) if is_camel else a.name for a in attrs.fields(cl)}


def spelled(keys: Iterable[str]) -> dict[str, str]:
    """Both spellings of each key → the key itself."""
    out: dict[str, str] = {}
    for key in keys:
        out.setdefault(camel(key), key)
        out.setdefault(snake(key), key)
        out[key] = key
    return out


def respell(value: Mapping[Any, Any], keys: Iterable[str]) -> tuple[dict[Any, Any], dict[str, str]]:
    """``value`` with each key in its own spelling, and own spelling → key as written.

    Raises:
        Invalid: both spellings of one key in the mapping (at the second one).
    """
    spellings = spelled(keys)
    out: dict[Any, Any] = {}
    written: dict[str, str] = {}
    for key, item in value.items():
        own = spellings.get(key, key) if isinstance(key, str) else key
        if own in out:
            first = written.get(own, own)
            raise Invalid(f"same key as {first!r}: write one spelling of it", (key,))
        out[own] = item
        if own != key:
            written[own] = key
    return out, written


def closest_key(key: str, keys: Iterable[str]) -> str | None:
    """The known key closest to an unknown ``key`` (matched in either spelling), if any."""
    spellings = spelled(keys)
    match = difflib.get_close_matches(key, spellings, n=1, cutoff=0.6)
    if not match:
        match = difflib.get_close_matches(snake(key), spellings, n=1, cutoff=0.6)
    return spellings[match[0]] if match else None


def allowed_keys(cl: type) -> Iterable[str]:
    """The keys an ``unknown key`` fault lists.

    Every provider key for a provider record; at the top level, the plugin block's keys too
    (the short form, docs/design.md#file-shape).
    """
    if cl in PROVIDER_CLASSES.values():
        return PROVIDER_KEYS
    if cl is FileShape:
        return (*key_names(FileShape).values(), *key_names(LoopConfig).values())
    return key_names(cl).values()
