"""``Sandbox``: how the built-in ``run_command`` confines a command a model chose.

A command runs under bubblewrap on Linux: the root file system read-only, the agent's cwd
writable (``workspace-write``) or not (``read-only``), a private ``/tmp``, ``.git`` and the
runtime's protected files read-only, no network unless ``network`` is set, its own PID
namespace, killed with its parent, and an environment scrubbed to an allow-list
(``docs/security.md``). Where bubblewrap is missing or cannot make namespaces, a command is a
``SANDBOX_UNAVAILABLE`` error, never an unconfined run; ``mode="off"`` is the explicit opt-out.
Plain data: policies come from ``open_runtime(sandbox=...)`` or the config's ``sandbox:`` key,
and an agent's own wins as a whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final, Literal, final

import attrs

__all__ = ["DEFAULT_SANDBOX", "SANDBOX_MODES", "Sandbox", "SandboxMode", "Workspace"]

SandboxMode = Literal["workspace-write", "read-only", "off"]
SANDBOX_MODES: Final[tuple[SandboxMode, ...]] = ("workspace-write", "read-only", "off")


def _valid_mode(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in SANDBOX_MODES:
        modes = ", ".join(SANDBOX_MODES)
        raise ValueError(f"Sandbox.{attribute.name} must be one of {modes}; got {value!r}")


def _positive_seconds(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Sandbox.{attribute.name} must be a number of seconds; got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"Sandbox.{attribute.name} must be a positive number; got {value!r}")


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(value)


@final
@attrs.frozen
class Sandbox:
    """How ``run_command`` confines its commands."""

    mode: SandboxMode = attrs.field(default="workspace-write", validator=_valid_mode)
    """``workspace-write`` (the cwd writable), ``read-only``, or ``off`` (no confinement: the
    command runs as the user, with the runtime's whole environment)."""
    network: bool = False
    """Let commands reach the network (default: a network namespace of their own, no links)."""
    env: tuple[str, ...] = attrs.field(default=(), converter=_names)
    """Environment variables passed to commands beside the built-in allow-list, by name
    (the only way a variable that looks like a secret reaches a command)."""
    max_timeout_s: float = attrs.field(default=600.0, validator=_positive_seconds)
    """The most seconds a command may ask for (``run_command``'s ``timeout_s`` is capped)."""


#: The sandbox of a runtime and agent that set none.
DEFAULT_SANDBOX: Final = Sandbox()


@final
@attrs.frozen
class Workspace:
    """What a built-in tool needs beyond its cwd: the sandbox and the paths nobody may write.

    Built once per agent and handed to its tools through ``ToolContext.workspace``.
    """

    sandbox: Sandbox = DEFAULT_SANDBOX
    protected: tuple[str, ...] = ()
    """Absolute paths no tool may write, whatever the mode or rule: the config file the runtime
    loaded, the CLI's settings directory, the store's files (``.git`` is protected anywhere)."""
