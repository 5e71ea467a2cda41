"""Untrusted JSON schemas (an MCP server's tool input schemas): refused, or compiled safely.

Design. A tool server's schema is data from a peer the runtime does not trust, and the stock
validators trust it three ways: fastjsonschema fetches a ``$ref`` that names a URL (with urllib,
from the agent host); every Python validator runs ``pattern`` with ``re``, which backtracks
(``(a+)+$`` against ``"aaa…a!"`` runs for seconds with the GIL held, so a worker thread would
freeze the event loop as well); and ``$ref`` fan-outs make checking cost double with each level.
So a server's schema is first checked here, without I/O, and refused (the tool is skipped, with
the reason) when:

- a ``$ref`` / ``$dynamicRef`` / ``$recursiveRef`` is not a local ``#...`` reference that
  resolves inside the schema, a nested ``$id`` moves the base URI, or a nested ``$schema``
  switches dialect (which would also switch the validator back to a stock one);
- a regex (``pattern``, a ``patternProperties`` key) is one RE2 cannot run: RE2 matches in time
  linear in the text, and so has no lookaround and no backreferences;
- it is longer than ``MAX_SCHEMA_BYTES`` as JSON, deeper than ``MAX_SCHEMA_DEPTH``, or larger than
  ``MAX_SCHEMA_NODES`` subschemas with its references expanded;
- it uses ``unevaluatedProperties`` and ``patternProperties`` together (the validator's
  ``unevaluatedProperties`` runs ``re`` on the patterns), names an unknown dialect, or fails
  its dialect's metaschema.

Arguments are then checked by python-jsonschema in the schema's dialect (2020-12 when it names
none, as MCP specifies), with an empty registry (nothing is ever retrieved), no format
assertions, RE2 for every regex, linear ``uniqueItems`` and ``enum``, and a cost budget
(``_schema_check.py``): a check that would pass ``MAX_CHECK_STEPS`` is an ``ArgumentsError``.
No schema and no arguments can hold the event loop for long.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, final
from urllib.parse import unquote

from ._schema_check import (
    MAX_CHECK_STEPS,
    SchemaCheck,
    SchemaRefused,
    compile_regexes,
    cut,
    shown,
)

__all__ = [
    "MAX_CHECK_STEPS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_NODES",
    "SchemaRefused",
    "untrusted_validator",
]

#: Longest schema accepted, in bytes of its JSON.
MAX_SCHEMA_BYTES: Final = 256 * 1024
#: Deepest nesting of subschemas (references expanded).
MAX_SCHEMA_DEPTH: Final = 64
#: Most subschemas, counted with every reference expanded (a cycle counts once).
MAX_SCHEMA_NODES: Final = 10_000

_DIALECTS: Final = {
    "https://json-schema.org/draft/2020-12/schema": "Draft202012Validator",
    "https://json-schema.org/draft/2019-09/schema": "Draft201909Validator",
    "http://json-schema.org/draft-07/schema": "Draft7Validator",
    "http://json-schema.org/draft-06/schema": "Draft6Validator",
    "http://json-schema.org/draft-04/schema": "Draft4Validator",
}
_REFS: Final = ("$ref", "$dynamicRef", "$recursiveRef")
_ANCHORS: Final = ("$anchor", "$dynamicAnchor")
_ONE: Final = (
    "additionalItems",
    "additionalProperties",
    "contains",
    "contentSchema",
    "else",
    "if",
    "items",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_LIST: Final = ("allOf", "anyOf", "items", "oneOf", "prefixItems")
_NAMED: Final = (
    "$defs",
    "definitions",
    "dependencies",
    "dependentSchemas",
    "patternProperties",
    "properties",
)


def _children(node: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The subschemas of ``node`` with their JSON-pointer steps (``properties/x``)."""
    for key in _ONE:
        if key in node and isinstance(node[key], Mapping | bool):
            yield key, node[key]
    for key in _LIST:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield f"{key}/{i}", sub
    for key in _NAMED:
        if isinstance(node.get(key), Mapping):
            for name, sub in node[key].items():
                if isinstance(sub, Mapping | bool):  # dependencies: also lists of names
                    yield f"{key}/{name}", sub


@final
class _Scan:
    """One walk over a schema, references expanded: the rules above, and its regexes."""

    def __init__(self, root: Mapping[str, Any], id_key: str) -> None:
        self.root = root
        self.id_key = id_key
        self.nodes = 0
        self.patterns: set[str] = set()
        self.keywords: set[str] = set()
        self.anchors: dict[str, Any] = {}
        self._collect_anchors(root, 0)

    def _collect_anchors(self, node: Any, depth: int) -> None:
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaRefused(f"it is nested deeper than {MAX_SCHEMA_DEPTH} levels")
        if not isinstance(node, Mapping):
            return
        names = [node.get(key) for key in _ANCHORS]
        ident = node.get(self.id_key)
        if isinstance(ident, str) and ident.startswith("#"):
            names.append(ident[1:])
        for name in names:
            if isinstance(name, str):
                self.anchors.setdefault(name, node)
        for _, sub in _children(node):
            self._collect_anchors(sub, depth + 1)

    def walk(self, node: Any, where: str, depth: int, expanding: tuple[int, ...]) -> None:
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise SchemaRefused(
                f"it has more than {MAX_SCHEMA_NODES:,} subschemas with its references expanded"
            )
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaRefused(f"it is nested deeper than {MAX_SCHEMA_DEPTH} levels")
        if not isinstance(node, Mapping):
            return  # a boolean schema; anything else is the metaschema's to name
        self._check(node, where or "/")
        for key in _REFS:
            if key in node:
                target = self._resolve(key, node[key], where)
                if id(target) not in expanding:  # a cycle is walked once
                    self.walk(target, node[key], depth + 1, (*expanding, id(target)))
        for step, sub in _children(node):
            self.walk(sub, f"{where}/{step}", depth + 1, expanding)

    def _check(self, node: Mapping[str, Any], where: str) -> None:
        self.keywords.update(k for k in ("patternProperties", "unevaluatedProperties") if k in node)
        if node is not self.root:
            if "$schema" in node:
                raise SchemaRefused(f"{where}: a nested $schema is not allowed")
            ident = node.get(self.id_key)
            if ident is not None and not (isinstance(ident, str) and ident.startswith("#")):
                raise SchemaRefused(
                    f"{where}: a nested {self.id_key} ({shown(ident)}) would move the base URI"
                )
        if isinstance(node.get("pattern"), str):
            self.patterns.add(node["pattern"])
        if isinstance(node.get("patternProperties"), Mapping):
            self.patterns.update(k for k in node["patternProperties"] if isinstance(k, str))

    def _resolve(self, key: str, ref: Any, where: str) -> Any:
        """The subschema a local reference points to (``#``, ``#/json/pointer``, ``#anchor``)."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaRefused(
                f"{where or '/'}: {key} {shown(ref)} is not a local reference ('#...'); a tool"
                " server's schema may not point outside itself"
            )
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            target = self.anchors.get(fragment)
        else:
            target = self.root
            for part in fragment.split("/")[1:] if fragment else ():
                step = part.replace("~1", "/").replace("~0", "~")
                if isinstance(target, Mapping) and step in target:
                    target = target[step]
                elif isinstance(target, list) and step.isdigit() and int(step) < len(target):
                    target = target[int(step)]
                else:
                    target = None
                    break
        if not isinstance(target, Mapping | bool):
            raise SchemaRefused(f"{where or '/'}: {key} {shown(ref)} does not point to a schema")
        return target


def _validator_class(schema: Mapping[str, Any]) -> tuple[Any, str]:
    """The python-jsonschema class for the schema's dialect, and the keyword of its ids."""
    from jsonschema import validators  # type: ignore[import-untyped]  # no py.typed

    dialect = schema.get("$schema", "https://json-schema.org/draft/2020-12/schema")
    name = _DIALECTS.get(dialect.rstrip("#")) if isinstance(dialect, str) else None
    if name is None:
        known = "2020-12, 2019-09, draft-07, draft-06 or draft-04"
        raise SchemaRefused(f"its $schema {shown(dialect)} is not a dialect known here ({known})")
    return getattr(validators, name), "id" if name == "Draft4Validator" else "$id"


def untrusted_validator(schema: Mapping[str, Any]) -> Callable[[Any], None]:
    """A check of arguments against a server's schema, raising ``ArgumentsError``.

    Raises:
        SchemaRefused: the schema breaks one of the rules of this module (the message says which).
    """
    if not isinstance(schema, Mapping):
        raise SchemaRefused("it is not a JSON object")
    try:
        size = len(json.dumps(schema, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise SchemaRefused(f"it is not JSON ({exc})") from None
    if size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(f"it is {size:,} bytes of JSON, more than {MAX_SCHEMA_BYTES:,}")
    cls, id_key = _validator_class(schema)
    scan = _Scan(schema, id_key)
    scan.walk(schema, "", 0, ())
    if {"patternProperties", "unevaluatedProperties"} <= scan.keywords:
        raise SchemaRefused(
            "unevaluatedProperties together with patternProperties is not supported"
        )
    regexes = compile_regexes(scan.patterns)
    from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]  # no py.typed

    try:
        cls.check_schema(schema, format_checker=None)
    except SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.absolute_path)
        raise SchemaRefused(f"{where}: {cut(exc.message)}") from None
    body = {k: v for k, v in schema.items() if k != "$schema"}  # subschemas keep this class
    return SchemaCheck(cls, body, regexes).validate
