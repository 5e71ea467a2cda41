"""What every verb resolves before it runs: config, user settings, store URL, and CLI errors.

The store a verb uses is the first of (docs/design.md#precedence): ``--store``; the
config's ``store``; ``$DSH_AGENT_STORE``; the ``store`` of the user settings file;
``sqlite:///sessions.db``. A config names the store of the agents it declares, so it beats the
user-wide defaults; the environment beats the settings file because it is set for one shell or
one command. The last three make the default every verb shares (``default_store``): what ``run``
stored is what ``sessions show`` finds, with no option repeated. ``StoredAt`` is the closing
note of ``run`` and ``chat``: where the session is, and the command that shows it.

Order matters: the config and the settings file are loaded and validated first, and the store
is only built (never opened) afterwards, so a bad config exits 2 without creating
``sessions.db``. The read-only verbs (``sessions ...``) read only the config's ``store``
(``config_store_url``): loading the whole config would import the tool modules it names, and
reading stored sessions needs none of it. Errors meant for the user are ``CliError``s carrying
their exit code; the application prints their message as one line, verbatim.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, final

import attrs
import yaml

from .._compose import load_config
from .._errors import ConfigError
from .._frozen import FrozenDict, freeze
from .._session.store import SessionStore
from .._tools.base import Tool
from .._tools.loader import load_tool_ref
from ..config import RuntimeConfig, Settings, load_settings_file
from ..stores import StoreUrlError, parse_store_url, store_from_url
from ._terminal import redact_url

__all__ = [
    "DEFAULT_STORE",
    "EXIT_AWAITING",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "STORE_ENV",
    "CliError",
    "StoredAt",
    "config_path",
    "config_store_url",
    "default_store",
    "load_cli_config",
    "load_cli_tools",
    "load_user_settings",
    "make_store",
    "missing_local_store",
    "settings_path",
    "store_args",
    "store_url",
    "with_cli_tools",
    "with_session",
]

#: The store the CLI uses when nothing names one: no option, config, variable or setting.
DEFAULT_STORE: Final = "sqlite:///sessions.db"
#: The environment variable naming the store of every verb that is given no other.
STORE_ENV: Final = "DSH_AGENT_STORE"
#: The settings file's key naming the same (the CLI's own: the runtime never sees it).
SETTINGS_STORE_KEY: Final = "store"
#: Largest config file ``config_store_url`` reads (as ``load_config``: 1 MiB).
MAX_CONFIG_BYTES: Final = 1024 * 1024

EXIT_OK: Final = 0
#: A turn ended ``error`` or ``interrupted``, ``check`` found violations, or a runtime failure.
EXIT_FAILED: Final = 1
#: Bad usage, bad config, or an unknown session.
EXIT_USAGE: Final = 2
#: ``run``: tool calls wait for a person's decision (they are listed on stderr).
EXIT_AWAITING: Final = 3


@final
class CliError(Exception):
    """An error shown to the user as one line (its message, verbatim) with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def settings_path(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CONFIG_HOME/dsh-agent/settings.yaml`` (``~/.config`` when unset or relative)."""
    base = environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "dsh-agent" / "settings.yaml"


def _settings_store(raw: Any, label: str) -> str | None:
    """The ``store`` of the settings file's mapping ``raw``, checked (None: not given)."""
    if not isinstance(raw, Mapping) or raw.get(SETTINGS_STORE_KEY) is None:
        return None
    return _checked_url(raw[SETTINGS_STORE_KEY], f"{label}: {SETTINGS_STORE_KEY}")


def _read_settings(path: Path) -> Any:
    """The settings file's YAML; a fault in it in the words of ``load_settings_file``."""
    try:
        return _read_config_yaml(str(path))
    except ConfigError as own:
        load_settings_file(path)  # raises the library's one line for the same fault
        raise own from None


def _checked_url(url: Any, where: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{where}: expected a store URL string")
    try:
        parse_store_url(url)
    except StoreUrlError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return url


def load_user_settings() -> Mapping[str, Any]:
    """Load the user settings file: the runtime's user layer (an empty mapping when absent).

    Its ``store`` is the CLI's own key (``default_store``): checked here, and left out of the
    layer the runtime is given.

    Raises:
        ConfigError: the file is unreadable or invalid.
    """
    path = settings_path()
    if not path.exists():
        return FrozenDict()
    label = str(path)
    raw = _read_settings(path)
    if not isinstance(raw, Mapping) or SETTINGS_STORE_KEY not in raw:
        return load_settings_file(path)
    _settings_store(raw, label)
    layer = {key: value for key, value in raw.items() if key != SETTINGS_STORE_KEY}
    try:
        Settings(user=layer)
    except ConfigError as exc:  # labelled ``<settings>``: name the file instead
        raise ConfigError(str(exc).replace("<settings>:", f"{label}:")) from None
    frozen: Mapping[str, Any] = freeze(layer)
    return frozen


def default_store(environ: Mapping[str, str] = os.environ) -> str:
    """The store of a verb given no ``--store`` and no config's ``store``.

    ``$DSH_AGENT_STORE`` (when set and not empty), else the settings file's ``store``, else
    ``sqlite:///sessions.db``. Of the settings file only ``store`` is read here.

    Raises:
        ConfigError: the variable or the setting is not a store URL, or the file is unreadable.
    """
    url = environ.get(STORE_ENV, "")
    if url.strip():
        return _checked_url(url, STORE_ENV)
    path = settings_path(environ)
    if path.exists():
        configured = _settings_store(_read_settings(path), str(path))
        if configured is not None:
            return configured
    return DEFAULT_STORE


def config_path(positional: str | None, option: str | None) -> str | None:
    """The config file named by the ``CONFIG`` positional or ``--config`` (not both).

    Raises:
        CliError: both name different files.
    """
    if positional is not None and option is not None and positional != option:
        raise CliError(f"give the config once: CONFIG {positional!r} or --config {option!r}")
    return positional if positional is not None else option


def load_cli_config(path: str | None) -> RuntimeConfig | None:
    """Load and validate the config file at ``path`` (None: no config).

    Raises:
        ConfigError: ``FILE: key.path: message``.
    """
    return None if path is None else load_config(path)


class _StoreOnlyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses duplicate keys (a second ``store`` would win silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_config_yaml(path: str) -> Any:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: file is larger than {MAX_CONFIG_BYTES} bytes (1 MiB)")
    try:
        return yaml.load(data.decode("utf-8"), Loader=_StoreOnlyLoader)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read: not UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from None
    except RecursionError:  # the composer recurses once a level
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None


def config_store_url(path: str | None) -> str | None:
    """The ``store`` of the config file at ``path`` (None: no config, or no ``store``).

    Only that key is read and checked: no tool reference is imported, no persona file read,
    no server started, and the rest of the file is not validated. The file is read with the
    bounds ``load_config`` keeps (1 MiB, safe YAML; aliases stay shared references).

    Raises:
        ConfigError: the file is unreadable, not YAML, or its ``store`` is not a store URL.
    """
    if path is None:
        return None
    raw = _read_config_yaml(path)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping (plugins, store, providers, mcpServers)")
    url = raw.get("store")
    if url is None:
        return None
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{path}: store: expected a store URL string")
    try:
        parse_store_url(url)
    except StoreUrlError as exc:
        raise ConfigError(f"{path}: store: {exc}") from None
    return url


def store_url(option: str | None, config: RuntimeConfig | str | None) -> str:
    """``--store``, else the config's store, else ``default_store()``.

    ``config`` is the loaded config, or the ``store`` ``config_store_url`` read (None: none).

    Raises:
        ConfigError: the default comes from a variable or setting that is not a store URL.
    """
    if option is not None:
        return option
    configured = config.store if isinstance(config, RuntimeConfig) else config
    if configured is not None:
        return configured
    return default_store()


@final
@attrs.frozen
class StoredAt:
    """Where ``run`` or ``chat`` stored its sessions: the lines it ends with, on stderr."""

    url: str
    """The store the verb used."""

    def lines(self, session_ids: Sequence[str]) -> list[str]:
        """Where the sessions are and the command that shows one; none for no session.

        The command names ``--store`` only when ``sessions show`` would not find the store by
        itself (``default_store``). The password of the URL is shown as ``***``.
        """
        if not session_ids:
            return []
        shown = redact_url(self.url)
        names = ", ".join(session_ids)
        plural = "s" if len(session_ids) > 1 else ""
        if parse_store_url(self.url).scheme == "memory":
            return [
                f"session{plural} {names} lived in {shown} and {'are' if plural else 'is'} gone"
                " now (give --store, or set DSH_AGENT_STORE, to keep sessions)"
            ]
        command = ["dsh-agent", "sessions", "show", session_ids[0], *store_args(self.url)]
        which = "one" if plural else "it"
        return [
            f"session{plural} {names} stored in {shown}",
            f"show {which} with: {' '.join(shlex.quote(part) for part in command)}",
        ]


def store_args(url: str) -> list[str]:
    """``["--store", URL]`` (password as ``***``) when a verb given no store would not find ``url``.

    A command printed for the user to run names the store only when it must: when ``url`` is not
    what ``default_store`` resolves to (or that cannot be read).
    """
    return [] if url == _quiet_default() else ["--store", redact_url(url)]


def _quiet_default() -> str | None:
    """``default_store()``, or None when it cannot be read (then ``--store`` is named)."""
    try:
        return default_store()
    except ConfigError:
        return None


def make_store(url: str) -> SessionStore:
    """Build (not open) the store ``url`` names.

    Raises:
        CliError: the URL is malformed or needs a missing extra (exit 2).
    """
    try:
        return store_from_url(url)
    except (ValueError, ImportError) as exc:
        raise CliError(f"--store: {exc}") from None


def missing_local_store(url: str) -> bool:
    """True when ``url`` names a SQLite file or JSONL directory that does not exist yet.

    Read-only verbs treat such a store as empty instead of creating it.
    """
    from ..stores import parse_store_url

    try:
        parsed = parse_store_url(url)
    except ValueError:
        return False  # opening it reports the error
    return parsed.scheme in ("sqlite", "jsonl") and not os.path.exists(parsed.target)


def load_cli_tools(refs: Sequence[str] | None) -> tuple[Tool, ...]:
    """The tools ``--tool MODULE:ATTR`` options name (the current directory is importable).

    Raises:
        CliError: a reference cannot be loaded, or two tools share a name (exit 2).
    """
    if not refs:
        return ()
    if "" not in sys.path and os.getcwd() not in sys.path:
        # As ``python -m`` would: a module next to the user's config is importable.
        sys.path.insert(0, os.getcwd())
    tools: dict[str, Tool] = {}
    for ref in refs:
        try:
            loaded = load_tool_ref(ref)
        except ValueError as exc:
            raise CliError(f"--tool: {exc}") from None
        for tool in loaded:
            if tool.name in tools and tools[tool.name] is not tool:
                raise CliError(f"--tool {ref}: a tool named {tool.name!r} was given already")
            tools[tool.name] = tool
    return tuple(tools.values())


def with_cli_tools(config: RuntimeConfig, tools: Sequence[Tool]) -> RuntimeConfig:
    """``config`` whose declared agents that list their tools also list ``tools``.

    Agents that list none already see every runtime tool, ``--tool`` ones included.
    """
    if not tools:
        return config
    names = [tool.name for tool in tools]
    entries = tuple(
        entry
        if entry.tools is None
        else attrs.evolve(entry, tools=(*entry.tools, *(n for n in names if n not in entry.tools)))
        for entry in config.agents
    )
    return attrs.evolve(config, plugin=attrs.evolve(config.plugin, agents=entries))


def with_session(
    config: RuntimeConfig,
    agent_ids: Sequence[str],
    *,
    session: str | None = None,
    resume: str | None = None,
) -> RuntimeConfig:
    """``config`` whose one selected agent runs on session ``session`` or ``resume``.

    ``session`` is created when it does not exist yet and continued when it does (the config's
    ``sessionId``); ``resume`` must exist (``resumeSessionId``).

    Raises:
        CliError: several agents are selected (exit 2).
    """
    if session is None and resume is None:
        return config
    option = "--session" if session is not None else "--resume"
    if len(agent_ids) != 1:
        raise CliError(
            f"{option} needs one agent: add --agent ID (declared: {', '.join(agent_ids)})"
        )
    entries = tuple(
        attrs.evolve(entry, session_id=session, resume_session_id=resume)
        if entry.id == agent_ids[0]
        else entry
        for entry in config.agents
    )
    return attrs.evolve(config, plugin=attrs.evolve(config.plugin, agents=entries))
