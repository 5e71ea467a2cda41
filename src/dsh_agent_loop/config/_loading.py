"""Loading: a config or settings file read and parsed as strict, bounded YAML.

A config is untrusted input, and every later step (structuring, the cross-field rules, freezing)
walks the loaded tree recursively. So loading bounds that tree before anything walks it: a file
is refused unread past 1 MiB; the YAML composer counts alias uses and the nodes they would add
when expanded, refusing a "billion laughs" document before the constructor builds anything;
collections nest at most 64 levels, checked while composing (the composer itself recurses) and
again over a mapping given directly, so depth is a ConfigError naming the key path, never a
RecursionError. A YAML syntax error names its line and column, and a hint when its cause is a
known mistake (an unquoted value with ``: `` in it, a tab, an unquoted ``*``: ``_yaml_hints.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from .._errors import ConfigError
from .._frozen import FrozenDict, freeze
from ._converter import MAX_CONFIG_DEPTH, check_nesting, converter, from_raw, structure
from ._document import RuntimeConfig
from ._faults import raise_faults, render
from ._providers import ProviderConfig, provider_faults
from ._rules import KeyPath, kind_name
from ._settings import settings_layer
from ._tools import ToolCatalog
from ._yaml_hints import yaml_hint

__all__ = ["load_config", "load_provider", "load_settings_file"]

_MAX_CONFIG_BYTES: Final = 1024 * 1024
"""Largest config or settings file read (1 MiB)."""
_MAX_YAML_ALIASES: Final = 100
"""Alias uses (``*name``, ``<<: *name``) allowed in one YAML document."""
_MAX_YAML_ALIAS_NODES: Final = 10_000
"""Nodes the aliases of one YAML document may add when expanded."""


class _Refused(yaml.YAMLError):
    """A YAML document over a loading limit: ``message`` at ``path``, found at ``where``."""

    def __init__(self, message: str, path: KeyPath, event: yaml.Event) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        mark = event.start_mark
        self.where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        """``line:column`` of the refused node (1-based), or empty."""


def _path_part(parent: yaml.Node | None, index: Any) -> str | int:
    """The key path element of a node composed under ``parent`` at ``index``."""
    if isinstance(index, int):
        return index
    if isinstance(index, yaml.ScalarNode):
        return str(index.value)
    return "<key>" if isinstance(parent, yaml.MappingNode) else "<complex key>"


class _StrictLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses duplicate keys, alias bombs and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}  # id(collection node) -> its node count, expanded
        self._path: list[str | int] = []

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        """Compose one node, keeping the alias budget and the nesting limit."""
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped stub
        if isinstance(event, yaml.AliasEvent):
            return self._compose_alias(parent, index, event)
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        if parent is not None:
            self._path.append(_path_part(parent, index))
        if len(self._path) >= MAX_CONFIG_DEPTH:
            problem = f"nested deeper than {MAX_CONFIG_DEPTH} levels"
            raise _Refused(problem, tuple(self._path), event)
        node = super().compose_node(parent, index)
        if parent is not None:
            self._path.pop()
        if isinstance(node, yaml.CollectionNode):
            children = (
                [n for pair in node.value for n in pair]
                if isinstance(node, yaml.MappingNode)
                else node.value
            )
            self._sizes[id(node)] = 1 + sum(self._sizes.get(id(c), 1) for c in children)
        return node

    def _compose_alias(
        self, parent: yaml.Node | None, index: Any, event: yaml.AliasEvent
    ) -> yaml.Node | None:
        node = super().compose_node(parent, index)  # an undefined alias fails here
        self._aliases += 1
        if self._aliases > _MAX_YAML_ALIASES:
            problem = f"more than {_MAX_YAML_ALIASES} YAML aliases; refusing to expand them"
            raise _Refused(problem, (), event)
        if isinstance(node, yaml.CollectionNode) and id(node) not in self._sizes:
            raise _Refused(f"YAML alias *{event.anchor} refers to itself", (), event)
        self._alias_nodes += self._sizes.get(id(node), 1)
        if self._alias_nodes > _MAX_YAML_ALIAS_NODES:
            problem = f"YAML aliases expand to more than {_MAX_YAML_ALIAS_NODES} nodes; refusing"
            raise _Refused(problem, (), event)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable: the base class reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str, label: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _Refused as exc:
        if exc.path:
            at = f" (at {exc.where})" if exc.where else ""
            raise ConfigError(f"{label}: {render(exc.path)}: {exc.message}{at}") from None
        where = f"{exc.where}: " if exc.where else ""
        raise ConfigError(f"{label}: {where}{exc.message}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        hint = yaml_hint(exc, text)
        more = f" (hint: {hint})" if hint is not None else ""
        raise ConfigError(f"{label}: {where}invalid YAML: {problem}{more}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label}: invalid YAML: {exc}") from None


def _read_yaml(path: str | os.PathLike[str], label: str) -> Any:
    try:
        with Path(path).open("rb") as file:
            data = file.read(_MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read: {exc.strerror or exc}") from None
    if len(data) > _MAX_CONFIG_BYTES:
        raise ConfigError(f"{label}: file is larger than {_MAX_CONFIG_BYTES} bytes (1 MiB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: cannot read: not UTF-8 text") from None
    return _parse_yaml(text, label)


def load_config(
    source: RuntimeConfig | str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    known_providers: Iterable[str] = (),
    known_tools: Iterable[str] = (),
    base_dir: str | os.PathLike[str] | None = None,
    tool_catalog: ToolCatalog | None = None,
) -> RuntimeConfig:
    """Load and validate a config: the whole file shape (docs/design.md#file-shape).

    Nothing is opened or started here; every fault is reported at once. The ``tools`` lists are
    checked against ``tool_catalog``: ``dsh_agent_loop.load_config`` (and ``open_runtime``)
    give the real one, which imports every ``package.module:attr`` reference.

    Args:
        source: a YAML file path; a mapping of the same shape (labelled ``<config>``); a
            ``RuntimeConfig`` (validated again and returned as is); None for an empty config.
        known_providers: provider names defined outside the config (``open_runtime``'s
            explicit ``providers=``), which agents may name too.
        known_tools: names of runtime tools given outside the config (``open_runtime``'s
            ``tools=``, the CLI's ``--tool``), which ``tools`` lists may name too.
        base_dir: directory ``personaFile`` is relative to; default the config file's
            directory, or the working directory for a mapping.
        tool_catalog: The built-in tool names and the reference loader the ``tools`` lists are
            checked with; None leaves them unchecked (their strings are kept as written).

    Returns:
        The validated config; ``personaFile`` paths are absolute. With a catalog, every
        ``package.module:attr`` tool reference has been imported and names tools.

    Raises:
        ConfigError: one line, ``FILE: key.path: message`` joined by ``; ``.
    """
    if isinstance(source, RuntimeConfig):
        raw = converter.unstructure(source, RuntimeConfig)
        base = os.fspath(base_dir) if base_dir is not None else os.getcwd()
        from_raw(raw, source.source, base, known_providers, known_tools, tool_catalog)
        return source
    if source is None or isinstance(source, Mapping):
        base = os.fspath(base_dir) if base_dir is not None else os.getcwd()
        return from_raw(source, "<config>", base, known_providers, known_tools, tool_catalog)
    if isinstance(source, str | os.PathLike):
        label = os.fspath(source)
        raw = _read_yaml(source, label)
        base = os.path.dirname(os.path.abspath(label)) if base_dir is None else os.fspath(base_dir)
        return from_raw(raw, label, base, known_providers, known_tools, tool_catalog)
    raise TypeError(f"config must be a RuntimeConfig, a path or a mapping, not {kind_name(source)}")


def load_provider(section: Mapping[str, Any], *, label: str) -> ProviderConfig:
    """Validate one provider section (the shape of ``providers.NAME``) into its record.

    Args:
        section: The section, ``kind`` included; either spelling of each key.
        label: Names the section in messages (``OpenAIProvider``).

    Raises:
        ConfigError: ``LABEL: key: message`` for each fault, joined by ``; ``.
    """
    check_nesting(section, label)
    record, faults = structure(section, ProviderConfig)
    faults.extend((path[2:], message) for path, message in provider_faults({"": section}))
    raise_faults(faults, section, label)
    assert record is not None
    checked: ProviderConfig = record
    return checked


def load_settings_file(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """Read the CLI's user settings file: a YAML mapping with the plugin block's keys.

    A missing file is an empty mapping (the file is optional); ``agents`` are not settings.

    Returns:
        The validated mapping, deep-frozen, ready for ``open_runtime(settings=...)``.

    Raises:
        ConfigError: unreadable file, invalid YAML, or a fault (``FILE: key.path: message``).
    """
    label = os.fspath(path)
    if not os.path.exists(label):
        return FrozenDict()
    raw = _read_yaml(path, label)
    settings_layer(raw, label)
    frozen: Mapping[str, Any] = freeze(raw) if raw is not None else FrozenDict()
    return frozen
