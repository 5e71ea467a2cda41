"""The short form of a config file: the plugin block's keys at the top level.

A file may write the plugin block's keys (``agents``, ``maxParallelToolCalls``, ``persona``,
``tools``, ...) beside ``store``, ``providers`` and ``mcpServers`` instead of under the seed's
``plugins: [{name: '@deepseek-ai/dsh-agent-loop', config: {...}}]`` wrapper
(docs/design.md#file-shape). One or the other: a file that writes both is refused, each short
key named. The short form is read as the wrapper it stands for, so every rule runs once, on one
shape; the faults found there are mapped back to the paths as written (``agents[0].model``, not
``plugins[0].config.agents[0].model``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ._agents import PLUGIN_NAME, LoopConfig
from ._keys import key_names, spelled
from ._rules import Fault

__all__ = ["as_written", "plugin_keys", "wrapped"]

_PLUGIN_KEYS: Final = spelled(key_names(LoopConfig).values())
"""Both spellings of each key of the plugin block → its own spelling."""
_WRAPPER: Final = ("plugins", 0, "config")
"""Where the short form's keys stand in the wrapper shape."""


def plugin_keys(raw: Mapping[Any, Any]) -> list[str]:
    """The top-level keys of ``raw`` that belong to the plugin block, in file order."""
    return [k for k in raw if isinstance(k, str) and k in _PLUGIN_KEYS]


def wrapped(raw: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """``raw`` in the wrapper shape: its plugin-block keys moved under ``plugins[0].config``.

    A file without such keys is returned as it is; one that also has ``plugins`` is returned
    without them (``as_written`` reports them).
    """
    short = plugin_keys(raw)
    if not short:
        return raw
    rest = {k: v for k, v in raw.items() if k not in short}
    if "plugins" in raw:
        return rest
    block = {k: raw[k] for k in short}
    return {"plugins": [{"name": PLUGIN_NAME, "config": block}], **rest}


def as_written(faults: Iterable[Fault], raw: Mapping[Any, Any]) -> list[Fault]:
    """The faults of ``wrapped(raw)`` with the key paths ``raw`` writes.

    A file with both forms gains one fault per short key.
    """
    short = plugin_keys(raw)
    if short and "plugins" in raw:
        both = (
            "cannot be combined with plugins: write the plugin block's keys either at the top"
            " level or under plugins[0].config, not both"
        )
        return [*(((key,), both) for key in short), *faults]
    if not short:
        return list(faults)
    cut = len(_WRAPPER)
    return [(path[cut:] if path[:cut] == _WRAPPER else path, message) for path, message in faults]
