"""``Permissions``: which tool calls run, which ask a person first, which are refused.

A policy is plain data: a mode and three lists of rules. A rule is a tool name (``read_file``)
or a name with a pattern (``run_command(git status*)``, ``write_file(src/**)``,
``fetch(url=https://example.com/*)``). Evaluation order is fixed: a matching ``deny`` rule
refuses the call (``DENIED``, naming the rule), then a matching ``ask`` rule defers it for a
person's decision (the durable approval of ``docs/embedding.md#tool-approval``), then a matching
``allow`` rule runs it, and otherwise the mode decides (``docs/security.md``). Policies come
from ``open_runtime(permissions=...)`` or the config's ``permissions:`` block, and an agent's
own (``AgentOptions(permissions=...)``, an agent entry's ``permissions:``) wins as a whole; a
sub-agent that sets none has its parent's. What a pattern matches for each tool is in
``_permission_rules.py``; how a call is judged, in ``_agent/_permissions.py``.

With no policy anywhere an agent behaves as under ``Permissions()``: mode ``ask``, no rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, final

import attrs

from ._permission_rules import rule_problem

__all__ = ["PERMISSION_MODES", "PermissionMode", "Permissions"]

PermissionMode = Literal["ask", "accept-edits", "allow-all", "deny-asks"]
#: The modes, in the order the docs present them.
PERMISSION_MODES: Final[tuple[PermissionMode, ...]] = (
    "ask",
    "accept-edits",
    "allow-all",
    "deny-asks",
)


def _rules(value: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _valid_mode(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in PERMISSION_MODES:
        modes = ", ".join(PERMISSION_MODES)
        raise ValueError(f"Permissions.{attribute.name} must be one of {modes}; got {value!r}")


def _valid_rules(
    _: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    for index, rule in enumerate(value):
        problem = rule_problem(rule)
        if problem is not None:
            raise ValueError(f"Permissions.{attribute.name}[{index}]: {problem}")


@final
@attrs.frozen(cache_hash=True)
class Permissions:
    """A permission policy: a mode and ``allow`` / ``ask`` / ``deny`` rules.

    Raises:
        ValueError: an unknown mode, or a rule that does not parse (named by its list and index).
    """

    mode: PermissionMode = attrs.field(default="ask", validator=_valid_mode)
    """What a call no rule matches does: ``ask`` (reads run; writes and commands ask; other
    tools as their ``requires_approval`` says), ``accept-edits`` (writes inside the cwd run too),
    ``allow-all`` (nothing asks), ``deny-asks`` (whatever would ask is refused)."""
    allow: tuple[str, ...] = attrs.field(default=(), converter=_rules, validator=_valid_rules)
    """Rules whose calls run without asking (unless a ``deny`` or ``ask`` rule matches)."""
    ask: tuple[str, ...] = attrs.field(default=(), converter=_rules, validator=_valid_rules)
    """Rules whose calls wait for a person's decision (unless a ``deny`` rule matches)."""
    deny: tuple[str, ...] = attrs.field(default=(), converter=_rules, validator=_valid_rules)
    """Rules whose calls are refused with ``DENIED``."""
