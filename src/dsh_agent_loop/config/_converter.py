"""The library's one cattrs converter: config records (strict) and events; the document check.

Structuring is strict and complete: hooks refuse coercion (``"5"`` is not an integer, ``true`` is
not ``1``), wrong container types and unknown keys, and check the single-field rules riding on
``Annotated`` types. Rules that span fields or need context (duplicate agent ids, an unknown
provider, ``personaFile`` on disk, keys of another provider kind) run over the raw tree
(``from_raw``), so they are reported even when the structure has other faults.

The same converter (un)structures an ``Event`` to and from its JSON object; the event hot paths
(``event_to_json``, the stores' rows) call those two functions directly instead of dispatching.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, Final, Literal

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from .._errors import ConfigError
from .._frozen import FrozenDict, freeze, thaw
from ..events import Event, event_from_dict, event_to_dict
from ._agents import (
    LIMITS_RULES,
    PERMISSIONS_RULES,
    PLUGIN_NAME,
    SANDBOX_RULES,
    TURN_BUDGET_RULES,
    Limits,
    LoopConfig,
    Permissions,
    Sandbox,
    TurnBudget,
    agent_faults,
    resolve_path,
    subagent_faults,
)
from ._document import FileShape, PluginEntry, RuntimeConfig
from ._faults import faults_of, raise_faults, render
from ._keys import key_names, respell, snake
from ._mcp import mcp_faults, mcp_tool_prefixes, resolve_mcp_paths
from ._providers import PROVIDER_CLASSES, PROVIDER_KEYS, ProviderConfig, provider_faults
from ._rules import Fault, Invalid, KeyPath, ProviderKind, Rule, kind_name
from ._short_form import as_written, wrapped
from ._tools import ToolCatalog, tool_faults
from ._tracing import OtelConfig

__all__ = ["MAX_CONFIG_DEPTH", "check_nesting", "converter", "from_raw", "structure"]

#: Field types that carry the rules of a record defined outside the config package.
_FIELD_RULES: Final[Mapping[type, Mapping[str, Any]]] = {
    TurnBudget: TURN_BUDGET_RULES,
    Limits: LIMITS_RULES,
    Permissions: PERMISSIONS_RULES,
    Sandbox: SANDBOX_RULES,
}

MAX_CONFIG_DEPTH: Final = 64
"""Deepest nesting of mappings and lists (the top-level mapping is level 1)."""
_MAX_CONFIG_VALUES: Final = 250_000
"""Values in a loaded tree, shared ones counted at each use (a mapping given directly can
share lists the way YAML aliases do)."""


# --- scalar and container hooks ---------------------------------------------------------------


def _structure_str(value: Any, _: Any) -> str:
    if isinstance(value, str):
        return value
    raise Invalid(f"expected a string, got {kind_name(value)}")


def _structure_int(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise Invalid(f"expected an integer, got {kind_name(value)}")


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise Invalid(f"expected a number, got {kind_name(value)}")


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise Invalid(f"expected a boolean, got {kind_name(value)}")


def _structure_json(value: Any, _: Any) -> Any:
    try:
        return freeze(value)
    except TypeError:
        raise Invalid("expected JSON-compatible data") from None


def _structure_literal(value: Any, type_: Any) -> Any:
    choices = typing.get_args(type_)
    if isinstance(value, str) and value in choices:
        return value
    shown = ", ".join(repr(c) for c in choices)
    got = repr(value) if isinstance(value, str) else kind_name(value)
    raise Invalid(f"must be one of {shown}, got {got}")


def _annotated_rule(type_: Any) -> Rule | None:
    if typing.get_origin(type_) is not Annotated:
        return None
    return next((m for m in type_.__metadata__ if isinstance(m, Rule)), None)


def _annotated_hook(type_: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    base = type_.__origin__
    rule = _annotated_rule(type_)
    assert rule is not None
    base_hook = _structure_str if _is_literal(base) else conv.get_structure_hook(base)

    def hook(value: Any, _: Any) -> Any:
        try:
            checked = base_hook(value, base)
        except Invalid:
            raise Invalid(f"must be {rule.expected}, got {kind_name(value)}") from None
        problem = rule.problem(checked)
        if problem is not None:
            raise Invalid(problem)
        return checked

    return hook


def _noted(exc: Exception, index: int | str, type_: Any) -> Exception:
    exc.add_note(IterableValidationNote(f"Structuring {type_} @ {index!r}", index, type_))
    return exc


def _tuple_hook(type_: Any, conv: cattrs.Converter) -> Callable[[Any, Any], tuple[Any, ...]]:
    item = typing.get_args(type_)[0]
    item_hook = conv.get_structure_hook(item)

    def hook(value: Any, _: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise Invalid(f"expected a list, got {kind_name(value)}")
        out: list[Any] = []
        errors: list[Exception] = []
        for index, element in enumerate(value):
            try:
                out.append(item_hook(element, item))
            except Exception as exc:
                errors.append(_noted(exc, index, type_))
        if errors:
            raise IterableValidationError(f"While structuring {type_}", errors, type_)
        return tuple(out)

    return hook


def _mapping_hook(type_: Any, conv: cattrs.Converter) -> Callable[[Any, Any], FrozenDict]:
    item = typing.get_args(type_)[1]
    item_hook = conv.get_structure_hook(item)

    def hook(value: Any, _: Any) -> FrozenDict:
        if not isinstance(value, Mapping):
            raise Invalid(f"expected a mapping, got {kind_name(value)}")
        out: dict[str, Any] = {}
        errors: list[Exception] = []
        for key, element in value.items():
            try:
                if not isinstance(key, str):
                    raise Invalid(f"keys must be strings, got {kind_name(key)}")
                out[key] = item_hook(element, item)
            except Exception as exc:
                errors.append(_noted(exc, str(key), type_))
        if errors:
            raise IterableValidationError(f"While structuring {type_}", errors, type_)
        return FrozenDict(out)

    return hook


# --- record hooks -----------------------------------------------------------------------------


def _attrs_structure_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    keys = key_names(cl)
    overrides: dict[str, Any] = {a: override(rename=k) for a, k in keys.items() if a != k}
    for name, ruled in _FIELD_RULES.get(cl, {}).items():
        overrides[name] = override(rename=keys[name], struct_hook=_ruled_hook(ruled, conv))
    generated: Callable[[Any, Any], Any] = make_dict_structure_fn(cl, conv, **overrides)
    optional = frozenset(keys[a.name] for a in attrs.fields(cl) if a.default is not attrs.NOTHING)
    own_keys = tuple(keys.values())

    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Invalid(f"expected a mapping, got {kind_name(value)}")
        # Either spelling of a key is read (``baseUrl``, ``base_url``), one per mapping.
        value, written = respell(value, own_keys)
        # ``key:`` with nothing after it (null) means the same as leaving the key out.
        if any(v is None and k in optional for k, v in value.items()):
            value = {k: v for k, v in value.items() if v is not None or k not in optional}
        try:
            return generated(value, cl)
        except ClassValidationError as exc:
            exc.written_keys = written  # type: ignore[attr-defined]  # read by faults_of
            raise

    return hook


def _ruled_hook(ruled: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """Structure a field as ``ruled`` (its type with rules) instead of its declared type."""
    base_hook = conv.get_structure_hook(ruled)

    def hook(value: Any, _: Any) -> Any:
        return base_hook(value, ruled)

    return hook


def _attrs_unstructure_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any], dict[str, Any]]:
    renames: dict[str, Any] = {a: override(rename=k) for a, k in key_names(cl).items() if a != k}
    if cl in PROVIDER_CLASSES.values():
        renames["kind"] = override(omit_if_default=False)  # the union's tag is always written
    return make_dict_unstructure_fn(cl, conv, _cattrs_omit_if_default=True, **renames)


def _provider_hook(conv: cattrs.Converter) -> Callable[[Any, Any], ProviderConfig]:
    """The tagged union: ``kind`` picks the record; keys of another kind are left to the rules."""
    kind_hook = conv.get_structure_hook(ProviderKind)

    def hook(value: Any, _: Any) -> ProviderConfig:
        if not isinstance(value, Mapping):
            raise Invalid(f"expected a mapping, got {kind_name(value)}")
        if "kind" not in value:
            raise Invalid("required key missing", ("kind",))
        try:
            kind = kind_hook(value["kind"], ProviderKind)
        except Invalid as exc:
            raise Invalid(exc.message, ("kind",)) from None
        cl = PROVIDER_CLASSES[kind]
        own = attrs.fields_dict(cl)
        section = {
            k: v
            for k, v in value.items()
            if not isinstance(k, str) or snake(k) in own or snake(k) not in PROVIDER_KEYS
        }
        record: ProviderConfig = conv.get_structure_hook(cl)(section, cl)
        return record

    return hook


def _plugin_entry_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any, Any], PluginEntry]:
    """A plugin entry of another plugin is refused by name, before its config is read."""
    generated = _attrs_structure_hook(cl, conv)

    def hook(value: Any, _: Any) -> PluginEntry:
        name = value.get("name") if isinstance(value, Mapping) else None
        if isinstance(name, str) and name != PLUGIN_NAME:
            raise Invalid(f"unknown plugin {name!r} (expected {PLUGIN_NAME!r})", ("name",))
        entry: PluginEntry = generated(value, cl)
        return entry

    return hook


def _otel_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any, Any], OtelConfig]:
    """``otel: true`` / ``otel: false`` are short for ``{enabled: true}`` / ``{enabled: false}``."""
    generated = _attrs_structure_hook(cl, conv)

    def hook(value: Any, _: Any) -> OtelConfig:
        if isinstance(value, bool):
            return OtelConfig(enabled=value)
        if not isinstance(value, Mapping):
            raise Invalid(f"expected a boolean or a mapping, got {kind_name(value)}")
        record: OtelConfig = generated(value, cl)
        return record

    return hook


def _sandbox_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any, Any], Sandbox]:
    """``sandbox: read-only`` is short for ``{mode: read-only}``."""
    generated = _attrs_structure_hook(cl, conv)

    def hook(value: Any, _: Any) -> Sandbox:
        if isinstance(value, str):
            value = {"mode": value}
        if not isinstance(value, Mapping):
            raise Invalid(f"expected a mode or a mapping, got {kind_name(value)}")
        record: Sandbox = generated(value, cl)
        return record

    return hook


def _runtime_config_unstructure_hook(
    cl: type, conv: cattrs.Converter
) -> Callable[[RuntimeConfig], dict[str, Any]]:
    """A ``RuntimeConfig`` unstructures to the file shape it was loaded from."""
    shape_hook = conv.get_unstructure_hook(FileShape)

    def hook(config: RuntimeConfig) -> dict[str, Any]:
        plugins = (PluginEntry(PLUGIN_NAME, config.plugin),)
        shape = FileShape(plugins, config.store, config.providers, config.mcp_servers)
        out: dict[str, Any] = shape_hook(shape)
        return out

    return hook


def _is_any(type_: Any) -> bool:
    return type_ is Any


def _is_literal(type_: Any) -> bool:
    origin: Any = typing.get_origin(type_)
    return origin is Literal


def _is_homogeneous_tuple(type_: Any) -> bool:
    args = typing.get_args(type_)
    return typing.get_origin(type_) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_str_mapping(type_: Any) -> bool:
    origin = typing.get_origin(type_)
    return origin in (Mapping, dict) and typing.get_args(type_)[0] is str


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, omit_if_default=True, detailed_validation=True)
    for cls, fn in ((str, _structure_str), (int, _structure_int), (float, _structure_float)):
        conv.register_structure_hook(cls, fn)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook_func(_is_any, _structure_json)
    conv.register_structure_hook_func(_is_literal, _structure_literal)
    conv.register_structure_hook_factory(_is_homogeneous_tuple, _tuple_hook)
    conv.register_structure_hook_factory(_is_str_mapping, _mapping_hook)
    conv.register_structure_hook_factory(attrs.has, _attrs_structure_hook)
    conv.register_structure_hook_factory(lambda t: _annotated_rule(t) is not None, _annotated_hook)
    conv.register_unstructure_hook_factory(attrs.has, _attrs_unstructure_hook)
    conv.register_unstructure_hook_func(
        lambda t: _is_str_mapping(t) and typing.get_args(t)[1] is Any, thaw
    )
    conv.register_structure_hook_func(lambda t: t == ProviderConfig, _provider_hook(conv))
    conv.register_structure_hook_factory(lambda t: t is PluginEntry, _plugin_entry_hook)
    conv.register_structure_hook_factory(lambda t: t is OtelConfig, _otel_hook)
    conv.register_structure_hook_factory(lambda t: t is Sandbox, _sandbox_hook)
    conv.register_unstructure_hook_factory(
        lambda t: t is RuntimeConfig, _runtime_config_unstructure_hook
    )
    conv.register_structure_hook(
        RuntimeConfig, lambda raw, _: from_raw(raw, "<config>", os.getcwd(), ())
    )
    conv.register_unstructure_hook(Event, event_to_dict)
    conv.register_structure_hook(Event, lambda obj, _: event_from_dict(obj))
    conv.register_unstructure_hook(FrozenDict, lambda d: d)
    conv.register_structure_hook(FrozenDict, lambda obj, _: freeze(obj))
    return conv


#: The one converter for the library's records: strict structuring of config records,
#: camelCase keys for the plugin block, defaults omitted when unstructuring
#: (``unstructure(RuntimeConfig)`` gives the file shape back); events to and from JSON objects.
converter: Final = _make_converter()


def structure(raw: Any, cl: Any) -> tuple[Any, list[Fault]]:
    """``raw`` structured as ``cl`` (None when faulty) and its faults."""
    try:
        return converter.structure(raw, cl), []
    except (ClassValidationError, IterableValidationError, Invalid) as exc:
        return None, list(faults_of(exc, ()))


# --- the whole document -----------------------------------------------------------------------


def _cross_faults(
    raw: Mapping[Any, Any],
    base_dir: str,
    extra: Iterable[str],
    known_tools: Iterable[str],
    catalog: ToolCatalog | None,
) -> Iterator[Fault]:
    """Rules that span fields or need context, checked on the raw tree (tolerating bad shapes)."""
    providers = raw.get("providers")
    known = set(extra)
    tool_names = frozenset(known_tools)
    if isinstance(providers, Mapping):
        known.update(k for k in providers if isinstance(k, str))
        yield from provider_faults(providers)
    yield from mcp_faults(raw)
    plugins = raw.get("plugins")
    if not isinstance(plugins, list | tuple):
        return
    ours = [
        i for i, p in enumerate(plugins) if isinstance(p, Mapping) and p.get("name") == PLUGIN_NAME
    ]
    for index in ours[1:]:
        yield ("plugins", index, "name"), f"duplicate plugin entry (first at plugins[{ours[0]}])"
    for index in ours:
        config = plugins[index].get("config")
        if not isinstance(config, Mapping):
            continue
        yield from tool_faults(
            config, ("plugins", index, "config"), tool_names, catalog, mcp_tool_prefixes(raw)
        )
        for key in ("agents", "subagents"):
            agents = config.get(key)
            if isinstance(agents, list | tuple):
                path = ("plugins", index, "config", key)
                yield from agent_faults(agents, path, frozenset(known), base_dir)
                if key == "subagents":
                    yield from subagent_faults(agents, path)


def check_nesting(raw: Any, label: str) -> None:
    """Refuse a tree nested deeper than the limit (a cycle included) or with too many values.

    Iterative, so a tree of any depth is refused without recursing; children are visited in
    order, so the path named is the first one in file order.

    Raises:
        ConfigError: ``LABEL: key.path: nested deeper than 64 levels`` or too many values.
    """
    stack: list[tuple[Any, KeyPath]] = [(raw, ())]
    values = 0
    while stack:
        value, path = stack.pop()
        if isinstance(value, Mapping):
            children: list[tuple[str | int, Any]] = [
                (k if isinstance(k, str) else str(k), v) for k, v in value.items()
            ]
        elif isinstance(value, list | tuple):
            children = list(enumerate(value))
        else:
            continue
        if len(path) >= MAX_CONFIG_DEPTH:
            where = f"{render(path)}: " if path else ""
            raise ConfigError(f"{label}: {where}nested deeper than {MAX_CONFIG_DEPTH} levels")
        values += len(children)
        if values > _MAX_CONFIG_VALUES:
            raise ConfigError(f"{label}: more than {_MAX_CONFIG_VALUES} values")
        stack.extend((child, (*path, key)) for key, child in reversed(children))


def from_raw(
    raw: Any,
    label: str,
    base_dir: str,
    known_providers: Iterable[str],
    known_tools: Iterable[str] = (),
    catalog: ToolCatalog | None = None,
) -> RuntimeConfig:
    """Validate a raw tree (a loaded file or a mapping) and build its ``RuntimeConfig``.

    ``catalog`` checks the ``tools`` lists (None: they are left unchecked).

    Raises:
        ConfigError: every fault, in one line.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{label}: expected a mapping at the top level, got {kind_name(raw)}")
    check_nesting(raw, label)
    written, raw = raw, wrapped(raw)  # the short form, read as the plugin block it stands for
    shape, faults = structure(raw, FileShape)
    faults.extend(_cross_faults(raw, base_dir, known_providers, known_tools, catalog))
    raise_faults(as_written(faults, written), written, label)
    assert isinstance(shape, FileShape)
    plugin = next((entry.config for entry in shape.plugins), LoopConfig())
    agents = tuple(
        attrs.evolve(a, persona_file=resolve_path(base_dir, a.persona_file))
        if a.persona_file is not None
        else a
        for a in plugin.agents
    )
    subagents = tuple(
        attrs.evolve(a, persona_file=resolve_path(base_dir, a.persona_file))
        if a.persona_file is not None
        else a
        for a in plugin.subagents
    )
    return RuntimeConfig(
        plugin=attrs.evolve(plugin, agents=agents, subagents=subagents),
        store=shape.store,
        providers=shape.providers,
        source=label,
        mcp_servers=resolve_mcp_paths(shape.mcp_servers, base_dir),
    )
