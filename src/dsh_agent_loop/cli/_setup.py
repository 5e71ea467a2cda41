"""What every verb resolves before it runs: config, user settings, store URL, and CLI errors.

Order matters: the config and the settings file are loaded and validated first, and the store
is only built (never opened) afterwards, so a bad config exits 2 without creating
``sessions.db``. Errors meant for the user are ``CliError``s carrying their exit code; the
application prints their message as one line, verbatim.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, final

import attrs

from ..config import RuntimeConfig, load_config, load_settings_file
from ..session.store import SessionStore
from ..stores.url import store_from_url
from ..tools.base import Tool
from ..tools.loader import load_tool_ref

__all__ = [
    "DEFAULT_STORE",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "config_path",
    "load_cli_config",
    "load_cli_tools",
    "load_user_settings",
    "make_store",
    "missing_local_store",
    "settings_path",
    "store_url",
    "with_cli_tools",
    "with_session",
]

#: The store the CLI uses when neither ``--store`` nor the config names one.
DEFAULT_STORE: Final = "sqlite:///sessions.db"

EXIT_OK: Final = 0
#: A turn ended ``error`` or ``interrupted``, ``check`` found violations, or a runtime failure.
EXIT_FAILED: Final = 1
#: Bad usage, bad config, or an unknown session.
EXIT_USAGE: Final = 2


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


def load_user_settings() -> Mapping[str, Any]:
    """Load the user settings file (an empty mapping when absent).

    Raises:
        ConfigError: the file is unreadable or invalid.
    """
    return load_settings_file(settings_path())


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


def store_url(option: str | None, config: RuntimeConfig | None) -> str:
    """``--store``, else the config's store, else ``sqlite:///sessions.db``."""
    if option is not None:
        return option
    if config is not None and config.store is not None:
        return config.store
    return DEFAULT_STORE


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
    from ..stores.url import parse_store_url

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
