r"""Permission rules: their syntax, what each kind of rule matches, and the exact rule of a call.

A rule is ``NAME`` (every call of the tool), ``*`` (every call of every tool) or
``NAME(PATTERN)``. What the pattern is matched against depends on the tool's name, so a rule
means the same whatever tools an agent has:

- ``run_command``: a glob on the command line (``*`` and ``?`` span anything, ``[...]`` is a
  class, ``\`` escapes): ``run_command(git status*)``, ``run_command(rm *)``.
- the file tools (``read_file``, ``list_dir``, ``search_text``, ``write_file``, ``edit_file``): a
  glob on the ``path`` argument, normalised and relative to the agent's cwd (``**`` spans
  directories, ``*`` does not; ``{a,b}`` alternates; dot files match): ``write_file(src/**)``,
  ``read_file(**/.env)``. A pattern starting with ``/`` is matched against the absolute path.
- any other tool: ``KEY=GLOB`` on the string form of one argument (a string as it is, anything
  else as compact JSON; a missing argument never matches), or ``*`` (every call).

Matching is lexical: nothing is read from the file system, and the tools themselves refuse a path
that resolves outside the cwd. Two rules keep an ``allow`` rule from granting more than it names:
a path outside the cwd never matches one, and a command line is split at its shell operators
(``;``, ``&&``, ``||``, ``|``, ``&``, newlines, ``( )``, ``$( )`` and backquotes, outside quotes)
so that a wildcard allow rule must match every simple command of it (``git status*`` does not
allow ``git status; rm -rf ~``) unless a rule without wildcards names the whole line. ``deny`` and
``ask`` rules match the whole line or any one of its simple commands (``rm *`` catches
``make && rm -rf build``), also with leading ``NAME=value`` assignments stripped. That split is
a best effort over shell syntax, not a parser: the sandbox, not a rule, is what confines a command
(``docs/security.md``).

Sans-I/O; the patterns are compiled by ``wcmatch`` (``fnmatch`` for commands and arguments,
``glob`` for paths) into regular expressions once per rule.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Literal, final

import attrs
from wcmatch import fnmatch, glob

__all__ = [
    "COMMAND_TOOL",
    "EDIT_TOOLS",
    "PATH_TOOLS",
    "Rule",
    "RuleError",
    "absolute_cwd",
    "argument_form",
    "command_allowed",
    "command_forms",
    "command_matches",
    "exact_rule",
    "parse_rule",
    "path_forms",
    "rule_problem",
]

COMMAND_TOOL: Final = "run_command"
#: Tools whose rule pattern is a glob on the ``path`` argument.
PATH_TOOLS: Final = frozenset({"read_file", "list_dir", "search_text", "write_file", "edit_file"})
#: The file tools that write (``accept-edits`` runs them inside the cwd).
EDIT_TOOLS: Final = frozenset({"write_file", "edit_file"})
#: The ``path`` a file tool uses when the call gives none.
_DEFAULT_PATHS: Final = {"list_dir": ".", "search_text": "."}

_PATH_FLAGS: Final = glob.GLOBSTAR | glob.DOTGLOB | glob.BRACE | glob.FORCEUNIX | glob.CASE
_TEXT_FLAGS: Final = fnmatch.DOTMATCH | fnmatch.FORCEUNIX | fnmatch.CASE
_NAME: Final = re.compile(r"[^\s()]+")
_KEY: Final = re.compile(r"[^\s()=]+")
_ASSIGNMENT: Final = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+")
#: Shell reserved words that run nothing themselves (a simple command may start with one).
_KEYWORDS: Final = frozenset(
    {"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "time"}
)
_OPERATORS: Final = frozenset(";&|\n()")

RuleKind = Literal["any", "command", "path", "argument"]


@final
class RuleError(ValueError):
    """A permission rule that does not parse (the message says why)."""


_COMMAND_MAGIC: Final = "\\*?["
_PATH_MAGIC: Final = "\\*?[{}"


def _escape(text: str, magic: str) -> str:
    """``text`` as a pattern that matches only itself (each wildcard character escaped)."""
    return "".join(f"\\{c}" if c in magic else c for c in text)


def _literal(pattern: str, magic: str) -> str | None:
    """The one text ``pattern`` matches when it has no wildcard (escapes undone), else None."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in magic:
            return None
        out.append(c)
        i += 1
    return "".join(out)


@final
@attrs.frozen
class Rule:
    """One parsed rule: the tool it names, what it matches, and its compiled pattern."""

    text: str
    """The rule as written (what a ``DENIED`` result names)."""
    tool: str
    """The tool name, or ``*`` for every tool."""
    kind: RuleKind
    """``any`` (every call), or what the pattern is matched against."""
    pattern: str = ""
    key: str = ""
    """The argument an ``argument`` rule looks at."""
    literal: str | None = None
    """The one text the pattern matches when it has no wildcard."""
    absolute: bool = False
    """A path pattern starting with ``/``: matched against the absolute path."""
    regexes: tuple[re.Pattern[str], ...] = ()

    def matches(self, text: str) -> bool:
        """True when the pattern matches ``text`` (a command, a path or an argument's form)."""
        return any(r.fullmatch(text) is not None for r in self.regexes)


def _compiled(pattern: str, path: bool) -> tuple[re.Pattern[str], ...]:
    try:
        if path:
            include, _ = glob.translate(pattern, flags=_PATH_FLAGS)
        else:
            include, _ = fnmatch.translate(pattern, flags=_TEXT_FLAGS)
    except Exception as exc:  # wcmatch's limits (a brace expansion too large, ...)
        raise RuleError(f"pattern {pattern!r} does not compile: {exc}") from None
    return tuple(re.compile(r) for r in include)


def _pattern_rule(text: str, name: str, inner: str) -> Rule:
    if name == "*":
        raise RuleError("'*' names every tool and takes no pattern")
    if not inner:
        raise RuleError("the pattern between the parentheses is empty")
    if name == COMMAND_TOOL:
        inner = inner.strip()  # a command is matched stripped
        if not inner:
            raise RuleError("the pattern between the parentheses is empty")
        literal = _literal(inner, _COMMAND_MAGIC)
        return Rule(text, name, "command", inner, literal=literal, regexes=_compiled(inner, False))
    if name in PATH_TOOLS:
        while inner.startswith("./") and len(inner) > 2:
            inner = inner[2:]
        absolute = inner.startswith("/")
        literal = _literal(inner, _PATH_MAGIC)
        regexes = _compiled(inner, True)
        return Rule(text, name, "path", inner, literal=literal, absolute=absolute, regexes=regexes)
    if inner.strip() == "*":
        return Rule(text, name, "any")
    key, eq, value = inner.partition("=")
    key = key.strip()
    if not eq or _KEY.fullmatch(key) is None:
        raise RuleError(f"the pattern of a {name!r} rule is KEY=GLOB (one argument) or *")
    literal = _literal(value, _COMMAND_MAGIC)
    return Rule(text, name, "argument", value, key, literal, regexes=_compiled(value, False))


def parse_rule(text: str) -> Rule:
    """Parse one rule.

    Raises:
        RuleError: not ``NAME``, ``*`` or ``NAME(PATTERN)`` with a pattern its tool takes.
    """
    if not isinstance(text, str):
        raise RuleError(f"a rule is a string, not {type(text).__name__}")
    head, paren, rest = text.strip().partition("(")
    name = head.strip()
    if not name or _NAME.fullmatch(name) is None:
        raise RuleError("expected a tool name, '*' or NAME(PATTERN)")
    if not paren:
        return Rule(text, name, "any")
    if not rest.endswith(")"):
        raise RuleError("a rule with a pattern ends with ')'")
    return _pattern_rule(text, name, rest[:-1])


def rule_problem(text: Any) -> str | None:
    """Why ``text`` is not a rule, or None when it parses."""
    try:
        parse_rule(text)
    except RuleError as exc:
        return f"{text!r} is not a permission rule: {exc}"
    return None


# --- what a call offers to match ----------------------------------------------------------------


def path_forms(name: str, arguments: Mapping[str, Any], cwd: str | None) -> tuple[str, str | None]:
    """``(absolute, relative)`` lexical forms of a file tool's path (relative None: outside).

    ``cwd`` is absolute (None: the agent has none; a relative path then stays relative).
    """
    raw = arguments.get("path", _DEFAULT_PATHS.get(name))
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        return "", None
    if cwd is None:
        relative = posixpath.normpath(raw)
        if posixpath.isabs(relative) or relative == ".." or relative.startswith("../"):
            return relative, None
        return relative, relative
    absolute = posixpath.normpath(posixpath.join(cwd, raw))
    root = cwd.rstrip("/")
    if absolute in (cwd, root):
        return absolute, "."
    if absolute.startswith(root + "/"):
        return absolute, absolute[len(root) + 1 :]
    return absolute, None


def argument_form(value: Any) -> str:
    """The string an argument rule's glob is matched against."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _segments(command: str) -> Iterator[str]:
    """The simple commands of a command line, split at operators outside quotes."""
    current: list[str] = []
    quote: str | None = None
    nested: list[tuple[str, str | None]] = []  # each open ( $( or `, and the quote around it
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        following = command[i + 1] if i + 1 < n else ""
        step = 1
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == "\\" and following:
            c, step = c + following, 2
        elif c == "`" or (c == "$" and following == "(") or (c == "(" and quote is None):
            if c == "`" and nested and nested[-1][0] == "`":
                quote = nested.pop()[1]
            else:
                nested.append((c, quote))
                quote = None
            yield "".join(current)
            current = []
            i += 2 if c == "$" else 1
            continue
        elif quote == '"':
            quote = None if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c in _OPERATORS and not _redirection(command, i):
            if c == ")" and nested and nested[-1][0] != "`":
                quote = nested.pop()[1]
            yield "".join(current)
            current = []
            i += 1
            continue
        current.append(c)
        i += step
    yield "".join(current)


def _redirection(command: str, i: int) -> bool:
    """True for the ``&`` of ``2>&1``, ``<&3`` or ``&>file`` (a redirection, not an operator)."""
    if command[i] != "&":
        return False
    before = command[i - 1] if i else ""
    after = command[i + 1] if i + 1 < len(command) else ""
    return before in ("<", ">") or after == ">"


def _without_keywords(segment: str) -> str:
    words = segment.split(None, 1)
    while words and words[0] in _KEYWORDS:
        segment = words[1] if len(words) > 1 else ""
        words = segment.split(None, 1)
    return segment


def command_forms(command: str) -> tuple[str, list[str]]:
    """``(whole line, simple commands)`` of a command, each stripped (keywords dropped)."""
    simple = []
    for segment in _segments(command):
        stripped = _without_keywords(segment.strip()).strip()
        if stripped:
            simple.append(stripped)
    return command.strip(), simple


def command_matches(rule: Rule, whole: str, simple: Sequence[str]) -> bool:
    """A deny or ask rule: the whole line or any simple command matches (assignments or not)."""
    if rule.matches(whole):
        return True
    for segment in simple:
        if rule.matches(segment):
            return True
        bare = _ASSIGNMENT.match(segment)
        if bare is not None and rule.matches(segment[bare.end() :]):
            return True
    return False


def command_allowed(rules: Sequence[Rule], whole: str, simple: Sequence[str]) -> Rule | None:
    """The allow rule that lets a command run, or None.

    A rule without wildcards allows the exact line it names; otherwise every simple command of
    the line must match one of ``rules`` (the rule returned is the first one's).
    """
    for rule in rules:
        if rule.kind == "any" or (rule.literal is not None and rule.literal == whole):
            return rule
    if not simple:
        return None
    first: Rule | None = None
    for segment in simple:
        found = next((r for r in rules if r.matches(segment)), None)
        if found is None:
            return None
        first = first or found
    return first


# --- "always": the exact rule of one call -------------------------------------------------------


def exact_rule(name: str, arguments: Mapping[str, Any], cwd: str | None) -> str | None:
    """An allow rule for exactly this call: its command, its path, or (other tools) the tool.

    None when no allow rule could match the call (a path outside the cwd, a command that is
    not a string).
    """
    if name == COMMAND_TOOL:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return None
        return f"{name}({_escape(command.strip(), _COMMAND_MAGIC)})"
    if name in PATH_TOOLS:
        _, relative = path_forms(name, arguments, cwd)
        if relative is None:
            return None
        return f"{name}({_escape(relative, _PATH_MAGIC)})"
    return name


def absolute_cwd(cwd: str | None) -> str | None:
    """The agent's cwd made absolute and normalised (``os.path.abspath``; None stays None)."""
    return None if cwd is None else os.path.abspath(cwd)
