"""Hints for YAML syntax errors whose cause is known: what a config author most often got wrong.

PyYAML names the problem as a parser sees it ("mapping values are not allowed here"); the hint
names the mistake as the author made it (a value with ``: `` in it that is not quoted) and, where
it can, shows the line fixed. A value is shown back only when its key does not look like it
holds a secret (docs/design.md#validation).
"""

from __future__ import annotations

import json
import re
from typing import Final

import yaml

__all__ = ["yaml_hint"]

_ENTRY: Final = re.compile(
    r"^\s*(?:-\s+)?(?P<key>[^\s#'\"][^:#]*?):\s+(?P<value>.*?)\s*(?:\s#.*)?$"
)
"""``key: value`` on one line (as a list item or not), a trailing comment left out."""
_SECRET_KEY: Final = re.compile(r"(?i)key|token|secret|password|auth|dsn")
_RESERVED: Final = {"@": "'@'", "`": "a backtick", "%": "'%'"}
"""Characters YAML reserves at the start of a plain value, as the hint names them."""


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _colon_hint(line: str) -> str:
    hint = "a value with ': ' in it, or ending in ':', must be quoted"
    entry = _ENTRY.match(line)
    if entry is None or _SECRET_KEY.search(entry["key"]):
        return hint
    return f"{hint}: {entry['key'].strip()}: {_quoted(entry['value'])}"


def yaml_hint(exc: yaml.MarkedYAMLError, text: str) -> str | None:
    """The hint for ``exc``, raised while reading ``text``, or None when none is known."""
    problem, context = exc.problem or "", exc.context or ""
    mark = exc.problem_mark
    lines = text.splitlines()
    line = lines[mark.line] if mark is not None and mark.line < len(lines) else ""
    if problem == "mapping values are not allowed here":
        return _colon_hint(line)
    if "'\\t'" in problem:
        return "indent with spaces: YAML does not allow tabs there"
    if context == "while scanning an alias":
        return "'*' starts a YAML alias: quote a value that starts with it (allow: [\"*\"])"
    if problem.startswith("found character") and "cannot start any token" in problem:
        found = next((name for char, name in _RESERVED.items() if f"'{char}'" in problem), None)
        if found is not None:
            return f"a value cannot start with {found} unless it is quoted"
    if context == "while scanning a double-quoted scalar" and "escape" in problem:
        return (
            "inside double quotes a backslash starts an escape: use single quotes"
            " ('C:\\path') or forward slashes for a Windows path"
        )
    if problem.startswith("expected <block end>"):
        return "check this line's indentation: the keys of one mapping line up under each other"
    return None
