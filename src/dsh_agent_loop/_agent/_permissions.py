"""Judging one tool call against the agent's permission policy: run it, ask a person, or refuse.

The order is fixed (``docs/security.md``): a matching ``deny`` rule refuses the call, naming the
rule; then a matching ``ask`` rule defers it for a person's decision; then a matching ``allow``
rule — the policy's, then those granted by "always" approvals in this agent's session — runs it;
otherwise the mode decides:

- ``ask``: the built-in ``write_file``, ``edit_file`` and ``run_command`` ask; any other tool
  asks when its ``requires_approval`` says so or ``AgentOptions.require_approval`` names it
  (so the built-in reads run).
- ``accept-edits``: as ``ask``, but the built-in ``write_file`` and ``edit_file`` run when their
  path is inside the cwd.
- ``allow-all``: nothing asks (only an ``ask`` rule does).
- ``deny-asks``: as ``ask``, but whatever would ask — a rule or the mode — is ``DENIED``, naming
  the mode (for unattended runs).

"Built-in" means the very ``Tool`` object the runtime's built-ins are (``services.builtin``): a
tool of your own named ``write_file`` keeps its own ``requires_approval``. The effective policy
is the agent's own (``AgentOptions.permissions``), else its parent's effective policy, else the
runtime's; none anywhere is ``Permissions()``. Granted rules are the agent's own: a sub-agent's
session records its own.

Cost: a policy is compiled once — rules parsed, their globs compiled, indexed by tool name — and
kept in ``Services.permission_policies`` (bounded, per runtime) under the policy and the
session's granted rules, so a call of a tool no rule names costs a dictionary lookup and the
mode's test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from .._permission_rules import (
    COMMAND_TOOL,
    EDIT_TOOLS,
    PATH_TOOLS,
    Rule,
    RuleError,
    absolute_cwd,
    argument_form,
    command_allowed,
    command_forms,
    command_matches,
    parse_rule,
    path_forms,
)
from .._permissions import Permissions

if TYPE_CHECKING:
    from .._tools.base import Tool

__all__ = ["ASK", "MAX_POLICIES", "CompiledPolicy", "Gate", "PolicyCache", "Verdict", "compiled"]

#: Compiled policies a runtime keeps (one per distinct policy and granted-rule set in use).
MAX_POLICIES: Final = 256
#: Tools a ``Gate`` remembers as always running (a new tool object beyond them is judged anew).
MAX_FREE_TOOLS: Final = 1024
#: The built-in tools the ``ask`` mode asks about.
_ASKING_BUILTINS: Final = frozenset({"write_file", "edit_file", COMMAND_TOOL})
_DEFAULT: Final = Permissions()


@final
class Verdict:
    """Why a call does not simply run: it asks, or it is denied (``text`` is its result)."""

    __slots__ = ("denied", "text")

    def __init__(self, denied: bool, text: str = "") -> None:
        self.denied = denied
        self.text = text


#: The verdict of a call that waits for a person's decision.
ASK: Final = Verdict(False)


@final
class _ToolRules:
    __slots__ = ("allow", "ask", "deny")

    def __init__(
        self, deny: tuple[Rule, ...], ask: tuple[Rule, ...], allow: tuple[Rule, ...]
    ) -> None:
        self.deny = deny
        self.ask = ask
        self.allow = allow


def _parsed(texts: Iterable[str], skip_bad: bool) -> list[Rule]:
    out = []
    for text in texts:
        try:
            out.append(parse_rule(text))
        except RuleError:
            if not skip_bad:
                raise
    return out


@final
class CompiledPolicy:
    """A policy's rules, parsed and compiled, by tool name (rules naming ``*`` merged in)."""

    __slots__ = ("mode", "rules", "star")

    def __init__(self, permissions: Permissions, granted: tuple[str, ...] = ()) -> None:
        self.mode = permissions.mode
        deny = _parsed(permissions.deny, False)
        ask = _parsed(permissions.ask, False)
        # granted rules come from the log: one that does not parse (invariants.check reports
        # it) grants nothing
        allow = _parsed(permissions.allow, False) + _parsed(granted, True)
        named = {r.tool for r in (*deny, *ask, *allow)} - {"*"}

        def of(rules: list[Rule], name: str) -> tuple[Rule, ...]:
            return tuple(r for r in rules if r.tool in (name, "*"))

        self.rules: dict[str, _ToolRules] = {
            name: _ToolRules(of(deny, name), of(ask, name), of(allow, name)) for name in named
        }
        star = _ToolRules(of(deny, "*"), of(ask, "*"), of(allow, "*"))
        self.star: _ToolRules | None = star if star.deny or star.ask or star.allow else None
        """The rules of a tool no rule names (those naming ``*``), None when there are none."""


class PolicyCache(Protocol):
    """Where a runtime keeps its compiled policies (``Services.permission_policies``)."""

    permission_policies: dict[tuple[Permissions | None, tuple[str, ...]], CompiledPolicy]


def compiled(
    services: PolicyCache, permissions: Permissions | None, granted: tuple[str, ...]
) -> CompiledPolicy:
    """The compiled form of ``permissions`` plus ``granted``, made once per runtime."""
    cache = services.permission_policies
    key = (permissions, granted)
    policy = cache.get(key)
    if policy is None:
        policy = CompiledPolicy(permissions or _DEFAULT, granted)
        if len(cache) >= MAX_POLICIES:
            del cache[next(iter(cache))]  # the oldest
        cache[key] = policy
    return policy


@final
class Gate:
    """Judges the calls of one step: ``check`` returns None (run) or a ``Verdict``."""

    __slots__ = ("_builtin", "_cwd", "_free", "_policy", "_require", "granted")

    def __init__(
        self,
        policy: CompiledPolicy,
        require_approval: frozenset[str],
        builtin: Callable[[str], Tool | None],
        cwd: str | None,
    ) -> None:
        self._policy = policy
        self._require = require_approval
        self._builtin = builtin
        self._cwd = None if cwd is None else _Lazy(cwd)
        self._free: set[Tool] = set()
        """Tools whose every call runs (no rule names them, the mode never asks about them):
        the common case costs one set lookup. Bounded by ``MAX_FREE_TOOLS``."""
        self.granted: tuple[str, ...] = ()
        """The granted rules compiled in (``gate`` compares them with the session's)."""

    @property
    def mode(self) -> str:
        """The policy's mode."""
        return self._policy.mode

    def check(self, tool: Tool, arguments: Mapping[str, Any]) -> Verdict | None:
        """None when the call runs now; ``ASK``; or a denial whose ``text`` is the result."""
        if tool in self._free:
            return None
        policy = self._policy
        name = tool.name
        rules = policy.rules.get(name, policy.star)
        if rules is None and self._always_runs(tool):
            if len(self._free) < MAX_FREE_TOOLS:
                self._free.add(tool)
            return None
        if rules is not None:
            call = _CallForms(name, arguments, self._cwd)
            for rule in rules.deny:
                if call.matches(rule):
                    return Verdict(True, f"Error: tool call denied by rule {rule.text!r}")
            for rule in rules.ask:
                if call.matches(rule):
                    return self._asks(f"rule {rule.text!r} asks for approval")
            if rules.allow and call.allowed(rules.allow):
                return None
        if self._mode_asks(tool, arguments):
            return self._asks("the call needs approval")
        return None

    def _always_runs(self, tool: Tool) -> bool:
        """True when the mode lets every call of ``tool`` run, whatever its arguments."""
        if self._policy.mode == "allow-all":
            return True
        name = tool.name
        if name in self._require or tool.requires_approval is not False:
            return False
        return name not in _ASKING_BUILTINS or self._builtin(name) is not tool

    def _asks(self, why: str) -> Verdict:
        if self._policy.mode != "deny-asks":
            return ASK
        return Verdict(True, f"Error: tool call denied by permission mode 'deny-asks' ({why})")

    def _mode_asks(self, tool: Tool, arguments: Mapping[str, Any]) -> bool:
        mode = self._policy.mode
        if mode == "allow-all":
            return False
        name = tool.name
        if name in self._require:
            return True
        if name in _ASKING_BUILTINS and self._builtin(name) is tool:
            if mode == "accept-edits" and name in EDIT_TOOLS:
                cwd = self._cwd
                _, relative = path_forms(name, arguments, None if cwd is None else cwd.value)
                return relative is None  # a write inside the cwd runs
            return True
        rule = tool.requires_approval
        if rule is False:
            return False
        try:
            return bool(rule(arguments)) if callable(rule) else bool(rule)
        except Exception:  # fail closed: a risky call never runs by accident
            return True


@final
class _Lazy:
    """The agent's cwd, made absolute on first use (only path rules and ``accept-edits`` ask)."""

    __slots__ = ("_raw", "_value")

    def __init__(self, raw: str) -> None:
        self._raw = raw
        self._value: str | None = None

    @property
    def value(self) -> str:
        if self._value is None:
            self._value = absolute_cwd(self._raw) or self._raw
        return self._value


@final
class _CallForms:
    """What one call offers the rules of its tool, each form computed on first use."""

    __slots__ = ("_arguments", "_command", "_cwd", "_name", "_path")

    def __init__(self, name: str, arguments: Mapping[str, Any], cwd: _Lazy | None) -> None:
        self._name = name
        self._arguments = arguments
        self._cwd = cwd
        self._command: tuple[str, list[str]] | None = None
        self._path: tuple[str, str | None] | None = None

    def _commands(self) -> tuple[str, list[str]] | None:
        if self._command is None:
            command = self._arguments.get("command")
            if not isinstance(command, str):
                return None
            self._command = command_forms(command)
        return self._command

    def _paths(self) -> tuple[str, str | None]:
        if self._path is None:
            cwd = None if self._cwd is None else self._cwd.value
            self._path = path_forms(self._name, self._arguments, cwd)
        return self._path

    def matches(self, rule: Rule) -> bool:
        """A deny or ask rule: does it name this call?"""
        kind = rule.kind
        if kind == "any":
            return True
        if kind == "command":
            forms = self._commands()
            return forms is not None and command_matches(rule, *forms)
        if kind == "path":
            absolute, relative = self._paths()
            if rule.absolute:
                return bool(absolute) and rule.matches(absolute)
            return relative is not None and rule.matches(relative)
        arguments = self._arguments
        return rule.key in arguments and rule.matches(argument_form(arguments[rule.key]))

    def allowed(self, rules: tuple[Rule, ...]) -> bool:
        """An allow rule: does one let this call run (never a path outside the cwd)?"""
        if any(r.kind == "any" for r in rules):
            return True
        if self._name == COMMAND_TOOL:
            forms = self._commands()
            return forms is not None and command_allowed(rules, *forms) is not None
        if self._name in PATH_TOOLS and self._paths()[1] is None:
            return False
        return any(self.matches(r) for r in rules)
