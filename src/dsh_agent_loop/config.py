"""Configuration: the config file as frozen records, strict loading, and layered live settings.

Loading is strict and complete. One cattrs converter structures the whole file shape with
detailed validation; its hooks refuse coercion (``"5"`` is not an integer, ``true`` is not
``1``), wrong container types and unknown keys, and check single-field rules (positive
integers, non-empty strings, store URLs). Rules that span fields or need context (duplicate
agent ids, an unknown provider, ``personaFile`` on disk) run over the raw tree, so they are
reported even when the structure has other faults. Every fault is mapped back to its key path
as written in the file (the plugin block keeps the seed's camelCase keys, ``store`` and
``providers`` are snake_case), sorted in file order and raised as one ``ConfigError`` line:
``FILE: key.path: message`` joined by ``; ``.

Settings are read through four layers, highest first: explicit keyword arguments, the user
layer (replaceable live), the plugin config, the defaults. Each read resolves the layers
again, so a new user layer applies to the next tool batch without a restart.
"""

from __future__ import annotations

import math
import os
import re
import typing
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeAlias, final

import attrs
import cattrs
import yaml
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ._frozen import FrozenDict, freeze, thaw
from .errors import ConfigError

__all__ = [
    "DEFAULT_MAX_PARALLEL_TOOL_CALLS",
    "PLUGIN_NAME",
    "AgentEntry",
    "LoopConfig",
    "ModelConfig",
    "ProviderConfig",
    "RuntimeConfig",
    "ScriptedReplyConfig",
    "ScriptedToolCallConfig",
    "Settings",
    "SettingsLayer",
    "TimeoutConfig",
    "TurnBudget",
    "converter",
    "load_config",
    "load_settings_file",
]

#: The ``name`` of this library's entry in the config file's ``plugins:`` list.
PLUGIN_NAME: Final = "@deepseek-ai/dsh-agent-loop"
#: ``maxParallelToolCalls`` when no layer sets it.
DEFAULT_MAX_PARALLEL_TOOL_CALLS: Final = 10
PROVIDER_KINDS: Final = ("openai", "anthropic", "scripted")

KeyPath = tuple[str | int, ...]
Fault = tuple[KeyPath, str]


class _Invalid(ValueError):
    """A fault found by a hook: ``message`` at ``subpath`` below the value being structured."""

    def __init__(self, message: str, subpath: KeyPath = ()) -> None:
        super().__init__(message)
        self.message = message
        self.subpath = subpath


@attrs.frozen
class _Rule:
    """A single-value rule attached with ``Annotated``: its base type, then ``problem(value)``."""

    expected: str
    problem: Callable[[Any], str | None]


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else "must be a positive integer"


def _positive_number(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else "must be a positive number"


def _non_negative_number(value: float) -> str | None:
    return None if math.isfinite(value) and value >= 0 else "must be a non-negative number"


def _non_empty(value: str) -> str | None:
    return None if value.strip() else "must be a non-empty string"


_STORE_HINT = "expected memory, sqlite:///PATH, jsonl:///PATH or postgresql://..."


def _store_url_problem(url: str) -> str | None:
    if url in ("memory", "memory:") or url.startswith(("postgresql://", "postgres://")):
        return None
    for scheme in ("sqlite", "jsonl"):
        if url.startswith(f"{scheme}:///"):
            return None if url[len(scheme) + 4 :] else f"store URL {url!r} has no PATH"
    return f"unsupported store URL {url!r} ({_STORE_HINT})"


def _provider_kind_problem(kind: str) -> str | None:
    if kind in PROVIDER_KINDS:
        return None
    return f"unknown provider kind {kind!r} (expected openai, anthropic or scripted)"


PositiveInt: TypeAlias = Annotated[int, _Rule("a positive integer", _at_least_one)]
PositiveNumber: TypeAlias = Annotated[float, _Rule("a positive number", _positive_number)]
NonNegativeNumber: TypeAlias = Annotated[
    float, _Rule("a non-negative number", _non_negative_number)
]
NonEmptyStr: TypeAlias = Annotated[str, _Rule("a non-empty string", _non_empty)]
StoreUrl: TypeAlias = Annotated[str, _Rule("a store URL string", _store_url_problem)]
ProviderKind: TypeAlias = Annotated[
    Literal["openai", "anthropic", "scripted"], _Rule("a string", _provider_kind_problem)
]
ReasoningReplay: TypeAlias = Literal["never", "tool-turns", "always"]
"""The ``reasoning_replay`` policy of an openai provider or model (SPEC §15)."""


def _to_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value)


def _frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return value if type(value) is FrozenDict else FrozenDict(value)


# --- records ----------------------------------------------------------------------------------


@final
@attrs.frozen
class TurnBudget:
    """Per-turn limits; exceeding one aborts the turn (``cause: hook``)."""

    max_steps: PositiveInt | None = None
    """Steps per turn."""
    max_tool_calls: PositiveInt | None = None
    """Tool calls per turn."""
    max_total_tokens: PositiveInt | None = None
    """Input plus output tokens over the turn."""
    max_seconds: PositiveNumber | None = None
    """Wall-clock (or runtime-clock) seconds per turn."""


@final
@attrs.frozen
class AgentEntry:
    """One declared agent (``agents[]`` in the plugin config block)."""

    id: NonEmptyStr
    """Stable label; unique among declared agents."""
    provider: NonEmptyStr | None = None
    model: NonEmptyStr | None = None
    reasoning_effort: NonEmptyStr | None = None
    max_tokens: PositiveInt | None = None
    """Per-request output-token cap."""
    cwd: NonEmptyStr | None = None
    """Working directory of the agent's tools (as written; relative to the process cwd)."""
    session_id: NonEmptyStr | None = None
    """Resume-or-create this session."""
    resume_session_id: NonEmptyStr | None = None
    """Resume this session, which must exist."""
    persona: str | None = None
    persona_file: NonEmptyStr | None = None
    """Persona text file; made absolute at load (relative to the config file's directory)."""
    tools: tuple[NonEmptyStr, ...] | None = None
    """Tool names from the registry (built-ins only when named); None = every runtime tool."""
    turn_budget: TurnBudget | None = None


@final
@attrs.frozen
class LoopConfig:
    """The plugin's ``config`` block."""

    max_parallel_tool_calls: PositiveInt | None = None
    persona: str | None = None
    """Runtime persona."""
    turn_budget: TurnBudget | None = None
    """Default budget of agents that set none."""
    agents: tuple[AgentEntry, ...] = attrs.field(default=(), converter=_to_tuple)


@final
@attrs.frozen
class SettingsLayer:
    """One settings layer (the user layer, a settings file): the plugin block minus agents."""

    max_parallel_tool_calls: PositiveInt | None = None
    persona: str | None = None
    turn_budget: TurnBudget | None = None


@final
@attrs.frozen
class TimeoutConfig:
    """HTTP timeouts of one provider, in seconds."""

    connect: PositiveNumber = 10.0
    read: PositiveNumber = 300.0


@final
@attrs.frozen
class ModelConfig:
    """Per-model overrides under a provider's ``models``."""

    context_window: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    reasoning_effort: NonEmptyStr | None = None
    reasoning_replay: ReasoningReplay | None = None
    """openai: which assistant messages carry ``reasoning_content`` (None: the provider's
    setting, else the built-in model table)."""


@final
@attrs.frozen
class ScriptedToolCallConfig:
    """A tool call in a scripted reply."""

    name: NonEmptyStr
    arguments: Mapping[str, Any] = attrs.field(factory=FrozenDict, converter=freeze)


@final
@attrs.frozen
class ScriptedReplyConfig:
    """One reply of a scripted provider."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ScriptedToolCallConfig, ...] = attrs.field(default=(), converter=_to_tuple)


@final
@attrs.frozen
class ProviderConfig:
    """One entry of the ``providers`` section."""

    kind: ProviderKind
    base_url: NonEmptyStr | None = None
    api_key_env: str | None = None
    """The env var holding the key; absent, null or ``""``: no key is sent (keyless servers
    and proxies), for both HTTP kinds."""
    headers: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=_frozen_map)
    timeout: TimeoutConfig = attrs.field(factory=TimeoutConfig)
    stream_usage: bool = True
    system_prompt_update: Literal["in-history", "head"] | None = None
    """None: from the built-in model table (``deepseek-*`` → ``in-history``, else head)."""
    context_window: PositiveInt | None = None
    reasoning_replay: ReasoningReplay | None = None
    """openai: ``never`` | ``tool-turns`` | ``always`` for every model (None: the model table)."""
    models: Mapping[str, ModelConfig] = attrs.field(factory=FrozenDict, converter=_frozen_map)
    replies: tuple[ScriptedReplyConfig, ...] = attrs.field(default=(), converter=_to_tuple)
    latency_ms: NonNegativeNumber = 0.0
    """Scripted: delay before each chunk."""
    loop: bool = False
    """Scripted: cycle the script."""


@final
@attrs.frozen
class RuntimeConfig:
    """A loaded, validated config file."""

    plugin: LoopConfig = attrs.field(factory=LoopConfig)
    store: StoreUrl | None = None
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=FrozenDict, converter=_frozen_map)
    source: str = "<config>"
    """Label used in error messages: the file path, or ``<config>``."""

    @property
    def agents(self) -> tuple[AgentEntry, ...]:
        """The declared agents."""
        return self.plugin.agents


@attrs.frozen
class _PluginEntry:
    name: str
    config: LoopConfig = attrs.field(factory=LoopConfig)


@attrs.frozen
class _FileShape:
    plugins: tuple[_PluginEntry, ...] = ()
    store: StoreUrl | None = None
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=FrozenDict, converter=_frozen_map)


_CAMEL_CLASSES: Final = frozenset({LoopConfig, AgentEntry, TurnBudget, SettingsLayer})
#: Keys valid only for one provider kind (``scripted`` vs the HTTP kinds).
_SCRIPTED_ONLY: Final = ("replies", "latency_ms", "loop")
_HTTP_ONLY: Final = (
    "base_url",
    "api_key_env",
    "headers",
    "timeout",
    "stream_usage",
    "models",
    "reasoning_replay",
)
_OPENAI_ONLY: Final = "reasoning_replay"
"""Valid only for kind ``openai``, in the provider section and in its ``models`` entries."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _key_names(cl: type) -> dict[str, str]:
    """Attribute name → key as written in the file."""
    camel = cl in _CAMEL_CLASSES
    return {a.name: _camel(a.name) if camel else a.name for a in attrs.fields(cl)}


# --- the converter ----------------------------------------------------------------------------


def _kind(value: Any) -> str:
    """Name of a raw value's type as a config author would say it."""
    if value is None:
        return "null"
    for cls, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, cls):
            return name
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def _structure_str(value: Any, _: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Invalid(f"expected a string, got {_kind(value)}")


def _structure_int(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _Invalid(f"expected an integer, got {_kind(value)}")


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise _Invalid(f"expected a number, got {_kind(value)}")


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _Invalid(f"expected a boolean, got {_kind(value)}")


def _structure_json(value: Any, _: Any) -> Any:
    try:
        return freeze(value)
    except TypeError:
        raise _Invalid("expected JSON-compatible data") from None


def _structure_literal(value: Any, type_: Any) -> Any:
    choices = typing.get_args(type_)
    if isinstance(value, str) and value in choices:
        return value
    shown = ", ".join(repr(c) for c in choices)
    got = repr(value) if isinstance(value, str) else _kind(value)
    raise _Invalid(f"must be one of {shown}, got {got}")


def _annotated_rule(type_: Any) -> _Rule | None:
    if typing.get_origin(type_) is not Annotated:
        return None
    return next((m for m in type_.__metadata__ if isinstance(m, _Rule)), None)


def _annotated_hook(type_: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    base = type_.__origin__
    rule = _annotated_rule(type_)
    assert rule is not None
    base_hook = _structure_str if _is_literal(base) else conv.get_structure_hook(base)

    def hook(value: Any, _: Any) -> Any:
        try:
            checked = base_hook(value, base)
        except _Invalid:
            raise _Invalid(f"must be {rule.expected}, got {_kind(value)}") from None
        problem = rule.problem(checked)
        if problem is not None:
            raise _Invalid(problem)
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
            raise _Invalid(f"expected a list, got {_kind(value)}")
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
            raise _Invalid(f"expected a mapping, got {_kind(value)}")
        out: dict[str, Any] = {}
        errors: list[Exception] = []
        for key, element in value.items():
            try:
                if not isinstance(key, str):
                    raise _Invalid(f"keys must be strings, got {_kind(key)}")
                out[key] = item_hook(element, item)
            except Exception as exc:
                errors.append(_noted(exc, str(key), type_))
        if errors:
            raise IterableValidationError(f"While structuring {type_}", errors, type_)
        return FrozenDict(out)

    return hook


def _attrs_structure_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    renames: dict[str, Any] = {a: override(rename=k) for a, k in _key_names(cl).items() if a != k}
    generated: Callable[[Any, Any], Any] = make_dict_structure_fn(cl, conv, **renames)
    keys = _key_names(cl)
    optional = frozenset(keys[a.name] for a in attrs.fields(cl) if a.default is not attrs.NOTHING)

    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Invalid(f"expected a mapping, got {_kind(value)}")
        # ``key:`` with nothing after it (null) means the same as leaving the key out.
        if any(v is None and k in optional for k, v in value.items()):
            value = {k: v for k, v in value.items() if v is not None or k not in optional}
        return generated(value, cl)

    return hook


def _attrs_unstructure_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any], dict[str, Any]]:
    renames: dict[str, Any] = {a: override(rename=k) for a, k in _key_names(cl).items() if a != k}
    return make_dict_unstructure_fn(cl, conv, _cattrs_omit_if_default=True, **renames)


def _plugin_entry_hook(cl: type, conv: cattrs.Converter) -> Callable[[Any, Any], _PluginEntry]:
    """A plugin entry of another plugin is refused by name, before its config is read."""
    generated = _attrs_structure_hook(cl, conv)

    def hook(value: Any, _: Any) -> _PluginEntry:
        name = value.get("name") if isinstance(value, Mapping) else None
        if isinstance(name, str) and name != PLUGIN_NAME:
            raise _Invalid(f"unknown plugin {name!r} (expected {PLUGIN_NAME!r})", ("name",))
        entry: _PluginEntry = generated(value, cl)
        return entry

    return hook


def _runtime_config_unstructure_hook(
    cl: type, conv: cattrs.Converter
) -> Callable[[RuntimeConfig], dict[str, Any]]:
    """A ``RuntimeConfig`` unstructures to the file shape it was loaded from."""
    shape_hook = conv.get_unstructure_hook(_FileShape)

    def hook(config: RuntimeConfig) -> dict[str, Any]:
        plugins = (_PluginEntry(PLUGIN_NAME, config.plugin),)
        out: dict[str, Any] = shape_hook(_FileShape(plugins, config.store, config.providers))
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
    conv.register_structure_hook_factory(lambda t: t is _PluginEntry, _plugin_entry_hook)
    conv.register_unstructure_hook_factory(
        lambda t: t is RuntimeConfig, _runtime_config_unstructure_hook
    )
    conv.register_structure_hook(
        RuntimeConfig, lambda raw, _: _from_raw(raw, "<config>", os.getcwd(), ())
    )
    return conv


#: The one converter for configuration records: strict structuring, camelCase keys for the
#: plugin block, defaults omitted when unstructuring (``unstructure(RuntimeConfig)`` gives the
#: file shape back).
converter: Final = _make_converter()


# --- faults -----------------------------------------------------------------------------------


def _note(exc: BaseException, cls: type[Any]) -> Any:
    return next((n for n in getattr(exc, "__notes__", ()) if type(n) is cls), None)


def _faults(exc: BaseException, path: KeyPath) -> Iterator[Fault]:
    """Every fault inside a cattrs validation error, with its path as written in the file."""
    if isinstance(exc, ClassValidationError):
        keys = _key_names(exc.cl)
        for sub in exc.exceptions:
            attribute = _note(sub, AttributeValidationNote)
            if attribute is not None:
                yield from _faults(sub, (*path, keys.get(attribute.name, attribute.name)))
            elif isinstance(sub, ForbiddenExtraKeysError):
                allowed = ", ".join(keys.values())
                for key in sub.extra_fields:
                    yield (*path, str(key)), f"unknown key (allowed: {allowed})"
            else:
                yield from _faults(sub, path)
    elif isinstance(exc, IterableValidationError):
        for sub in exc.exceptions:
            element = _note(sub, IterableValidationNote)
            yield from _faults(sub, path if element is None else (*path, element.index))
    elif isinstance(exc, _Invalid):
        yield (*path, *exc.subpath), exc.message
    elif isinstance(exc, KeyError):
        yield path, "required key missing"
    else:
        yield path, str(exc) or type(exc).__name__


_PLAIN_KEY = re.compile(r"[A-Za-z_@][\w@/-]*")


def _render(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _position(raw: Any, path: KeyPath) -> tuple[int, ...]:
    """Where ``path`` is in the raw tree, so faults come out in file order."""
    out: list[int] = []
    node = raw
    for part in path:
        if isinstance(node, Mapping):
            keys = [str(k) for k in node]
            index = keys.index(part) if part in keys else len(keys)
            node = list(node.values())[index] if index < len(keys) else None
        elif isinstance(node, list | tuple) and isinstance(part, int) and part < len(node):
            index, node = part, node[part]
        else:
            index, node = 0, None
        out.append(index)
    return tuple(out)


def _raise_faults(faults: Iterable[Fault], raw: Any, label: str) -> None:
    unique = list(dict.fromkeys(faults))
    if not unique:
        return
    unique.sort(key=lambda fault: _position(raw, fault[0]))
    raise ConfigError(
        "; ".join(
            f"{label}: {_render(path)}: {message}" if path else f"{label}: {message}"
            for path, message in unique
        )
    )


def _structure(raw: Any, cl: type[Any]) -> tuple[Any, list[Fault]]:
    try:
        return converter.structure(raw, cl), []
    except (ClassValidationError, IterableValidationError, _Invalid) as exc:
        return None, list(_faults(exc, ()))


# --- rules across fields ----------------------------------------------------------------------


def _resolve_path(base_dir: str, path: str) -> str:
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(path)))


def _provider_faults(providers: Mapping[Any, Any]) -> Iterator[Fault]:
    for name, provider in providers.items():
        if not isinstance(provider, Mapping):
            continue
        kind = provider.get("kind")
        wrong: tuple[str, ...]
        if kind == "scripted":
            wrong, why = _HTTP_ONLY, "not valid for kind 'scripted'"
        elif kind in PROVIDER_KINDS:
            wrong, why = _SCRIPTED_ONLY, "only valid for kind 'scripted'"
        else:
            continue
        for key in provider:
            if key in wrong:
                yield ("providers", str(name), key), why
        base_url = provider.get("base_url")
        if kind != "scripted" and isinstance(base_url, str) and not _is_http_url(base_url):
            yield ("providers", str(name), "base_url"), "must be an http:// or https:// URL"
        if kind == "anthropic":
            yield from _openai_only_faults(str(name), provider)


def _is_http_url(url: str) -> bool:
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.hostname)


def _openai_only_faults(name: str, provider: Mapping[Any, Any]) -> Iterator[Fault]:
    why = "only valid for kind 'openai'"
    if _OPENAI_ONLY in provider:
        yield ("providers", name, _OPENAI_ONLY), why
    models = provider.get("models")
    if isinstance(models, Mapping):
        for model, entry in models.items():
            if isinstance(entry, Mapping) and _OPENAI_ONLY in entry:
                yield ("providers", name, "models", str(model), _OPENAI_ONLY), why


def _agent_faults(
    agents: Sequence[Any], path: KeyPath, known: frozenset[str], base_dir: str
) -> Iterator[Fault]:
    first_index: dict[str, int] = {}
    for index, agent in enumerate(agents):
        if not isinstance(agent, Mapping):
            continue
        at = (*path, index)
        agent_id = agent.get("id")
        if isinstance(agent_id, str):
            if agent_id in first_index:
                first = first_index[agent_id]
                yield (*at, "id"), f"duplicate agent id {agent_id!r} (also agents[{first}])"
            first_index.setdefault(agent_id, index)
        if agent.get("sessionId") is not None and agent.get("resumeSessionId") is not None:
            yield (*at, "resumeSessionId"), "cannot be combined with sessionId"
        persona_file = agent.get("personaFile")
        if agent.get("persona") is not None and persona_file is not None:
            yield (*at, "personaFile"), "cannot be combined with persona"
        elif isinstance(persona_file, str) and persona_file.strip():
            resolved = _resolve_path(base_dir, persona_file)
            if not os.path.isfile(resolved):
                yield (*at, "personaFile"), f"file not found: {resolved}"
        provider = agent.get("provider")
        if isinstance(provider, str) and provider.strip() and provider not in known:
            names = ", ".join(sorted(known)) if known else "none configured"
            yield (*at, "provider"), f"unknown provider {provider!r} (known: {names})"


def _cross_faults(raw: Mapping[Any, Any], base_dir: str, extra: Iterable[str]) -> Iterator[Fault]:
    """Rules that span fields or need context, checked on the raw tree (tolerating bad shapes)."""
    providers = raw.get("providers")
    known = set(extra)
    if isinstance(providers, Mapping):
        known.update(k for k in providers if isinstance(k, str))
        yield from _provider_faults(providers)
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
        agents = config.get("agents") if isinstance(config, Mapping) else None
        if isinstance(agents, list | tuple):
            path = ("plugins", index, "config", "agents")
            yield from _agent_faults(agents, path, frozenset(known), base_dir)


# --- loading ----------------------------------------------------------------------------------
#
# A config is untrusted input, and every later step (structuring, the cross-field rules,
# freezing) walks the loaded tree recursively. So loading bounds that tree before anything walks
# it: a file is refused unread past 1 MiB; the YAML composer counts alias uses and the nodes
# they would add when expanded, refusing a "billion laughs" document before the constructor
# builds anything; collections nest at most 64 levels, checked while composing (the composer
# itself recurses) and again over a mapping given directly, so depth is a ConfigError naming
# the key path, never a RecursionError.

_MAX_CONFIG_BYTES: Final = 1024 * 1024
"""Largest config or settings file read (1 MiB)."""
_MAX_YAML_ALIASES: Final = 100
"""Alias uses (``*name``, ``<<: *name``) allowed in one YAML document."""
_MAX_YAML_ALIAS_NODES: Final = 10_000
"""Nodes the aliases of one YAML document may add when expanded."""
_MAX_CONFIG_DEPTH: Final = 64
"""Deepest nesting of mappings and lists (the top-level mapping is level 1)."""
_MAX_CONFIG_VALUES: Final = 250_000
"""Values in a loaded tree, shared ones counted at each use (a mapping given directly can
share lists the way YAML aliases do)."""


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
        if len(self._path) >= _MAX_CONFIG_DEPTH:
            problem = f"nested deeper than {_MAX_CONFIG_DEPTH} levels"
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
            raise ConfigError(f"{label}: {_render(exc.path)}: {exc.message}{at}") from None
        where = f"{exc.where}: " if exc.where else ""
        raise ConfigError(f"{label}: {where}{exc.message}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"{label}: {where}invalid YAML: {problem}") from None
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


def _check_nesting(raw: Any, label: str) -> None:
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
        if len(path) >= _MAX_CONFIG_DEPTH:
            where = f"{_render(path)}: " if path else ""
            raise ConfigError(f"{label}: {where}nested deeper than {_MAX_CONFIG_DEPTH} levels")
        values += len(children)
        if values > _MAX_CONFIG_VALUES:
            raise ConfigError(f"{label}: more than {_MAX_CONFIG_VALUES} values")
        stack.extend((child, (*path, key)) for key, child in reversed(children))


def _from_raw(raw: Any, label: str, base_dir: str, known_providers: Iterable[str]) -> RuntimeConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{label}: expected a mapping at the top level, got {_kind(raw)}")
    _check_nesting(raw, label)
    shape, faults = _structure(raw, _FileShape)
    faults.extend(_cross_faults(raw, base_dir, known_providers))
    _raise_faults(faults, raw, label)
    assert isinstance(shape, _FileShape)
    plugin = next((entry.config for entry in shape.plugins), LoopConfig())
    agents = tuple(
        attrs.evolve(a, persona_file=_resolve_path(base_dir, a.persona_file))
        if a.persona_file is not None
        else a
        for a in plugin.agents
    )
    return RuntimeConfig(
        plugin=attrs.evolve(plugin, agents=agents),
        store=shape.store,
        providers=shape.providers,
        source=label,
    )


def load_config(
    source: RuntimeConfig | str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    known_providers: Iterable[str] = (),
    base_dir: str | os.PathLike[str] | None = None,
) -> RuntimeConfig:
    """Load and validate a config: the whole file shape (SPEC §16).

    Nothing is opened or started here; every fault is reported at once.

    Args:
        source: a YAML file path; a mapping of the same shape (labelled ``<config>``); a
            ``RuntimeConfig`` (validated again and returned as is); None for an empty config.
        known_providers: provider names defined outside the config (``open_runtime``'s
            explicit ``providers=``), which agents may name too.
        base_dir: directory ``personaFile`` is relative to; default the config file's
            directory, or the working directory for a mapping.

    Returns:
        The validated config; ``personaFile`` paths are absolute.

    Raises:
        ConfigError: one line, ``FILE: key.path: message`` joined by ``; ``.
    """
    if isinstance(source, RuntimeConfig):
        raw = converter.unstructure(source, RuntimeConfig)
        base = os.fspath(base_dir) if base_dir is not None else os.getcwd()
        _from_raw(raw, source.source, base, known_providers)
        return source
    if source is None or isinstance(source, Mapping):
        base = os.fspath(base_dir) if base_dir is not None else os.getcwd()
        return _from_raw(source, "<config>", base, known_providers)
    if isinstance(source, str | os.PathLike):
        label = os.fspath(source)
        raw = _read_yaml(source, label)
        base = os.path.dirname(os.path.abspath(label)) if base_dir is None else os.fspath(base_dir)
        return _from_raw(raw, label, base, known_providers)
    raise TypeError(f"config must be a RuntimeConfig, a path or a mapping, not {_kind(source)}")


def _settings_layer(raw: Any, label: str) -> SettingsLayer:
    if isinstance(raw, SettingsLayer):
        return raw
    if raw is None:
        return SettingsLayer()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{label}: expected a mapping at the top level, got {_kind(raw)}")
    layer, faults = _structure(raw, SettingsLayer)
    _raise_faults(faults, raw, label)
    assert isinstance(layer, SettingsLayer)
    return layer


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
    _settings_layer(raw, label)
    frozen: Mapping[str, Any] = freeze(raw) if raw is not None else FrozenDict()
    return frozen


# --- live settings ----------------------------------------------------------------------------


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
        self._user: SettingsLayer = _settings_layer(user, "<settings>")
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
        self._user = _settings_layer(mapping, "<settings>")
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
