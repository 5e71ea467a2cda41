"""``SchemaCheck``: arguments checked against an accepted untrusted schema, at bounded cost.

Design. python-jsonschema does the checking, in the schema's dialect, with an empty
``referencing`` registry (a reference that does not resolve inside the schema fails; nothing is
retrieved) and no format assertions. Its keywords that would run Python's backtracking ``re``
(``pattern``, ``patternProperties``, ``additionalProperties``) are replaced by RE2 versions,
and the ones whose cost is quadratic (``uniqueItems``: pairwise, ``enum``: a scan per value;
``properties``: a scan of the schema per value) by linear ones over canonical keys. Every
keyword is wrapped to spend from a budget: one step, plus the length of a list or object
keyword value it iterates, plus the items of the value it descends into; an error it yields
costs the size of the value it may quote (the stock keywords quote the whole value in their
messages). A check that overspends stops with an ``ArgumentsError`` the model reads
(``_schema.py`` says why all this is needed). What both modules use (``SchemaRefused``, the
RE2 compiler, short quoting) lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, NoReturn, final

from .._tools.base import ArgumentsError

__all__ = ["MAX_CHECK_STEPS", "SchemaCheck", "SchemaRefused", "compile_regexes", "cut", "shown"]

#: Most steps one check of arguments may take (a keyword applied to a value, plus its size).
MAX_CHECK_STEPS: Final = 50_000
#: Bytes of memory RE2 may use for one compiled regex.
REGEX_MAX_MEM: Final = 1 << 20
#: Characters of a value quoted in an error message.
SHOWN: Final = 80
#: Characters of a value quoted, hashed or matched whole that cost one step.
REPR_STEP: Final = 512
#: Steps a reference costs (resolving one costs about that many keywords).
REFERENCE_STEPS: Final = 3
#: Keywords whose list or object value is iterated for each value they apply to.
_ITERATING: Final = frozenset(
    {
        "allOf",
        "anyOf",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "oneOf",
        "prefixItems",
        "required",
        "type",
    }
)
#: Keywords that descend into each item or property of the value they apply to.
_DESCENDING: Final = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "items",
        "properties",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)


@final
class SchemaRefused(ValueError):
    """Why a server's schema is not used (the message names the rule it breaks)."""


def shown(value: Any) -> str:
    """``repr(value)``, cut to ``SHOWN`` characters."""
    text = repr(value[: SHOWN + 1] if isinstance(value, str) else value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def compile_regexes(patterns: set[str]) -> dict[str, Any]:
    """Each pattern compiled with RE2, or ``SchemaRefused`` naming the first it cannot run."""
    import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

    options = re2.Options()
    options.log_errors = False
    options.max_mem = REGEX_MAX_MEM
    compiled: dict[str, Any] = {}
    for pattern in sorted(patterns):
        try:
            compiled[pattern] = re2.compile(pattern, options)
        except re2.error as exc:
            reason = exc.args[0].decode("utf-8", "replace") if exc.args else "unknown"
            raise SchemaRefused(
                f"the regex {shown(pattern)} is not one a linear-time engine (RE2) can run"
                f" ({reason}); lookaround and backreferences are not supported"
            ) from None
    return compiled


def cut(text: str, limit: int = 300) -> str:
    """``text``, cut to ``limit`` characters."""
    return text if len(text) <= limit else text[:limit] + "…"


def raise_for(message: str) -> NoReturn:
    """Raise the ``ArgumentsError`` the model reads."""
    raise ArgumentsError(cut(message, 500))


class _OverBudget(Exception):
    """The check took more than ``MAX_CHECK_STEPS``."""


def canonical(value: Any) -> Any:
    """A hashable key equal for JSON-equal values (``1 == 1.0``, ``True != 1``, key order)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, Mapping):
        return ("o", frozenset((k, canonical(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("a", tuple(canonical(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("?", id(value))
    return ("v", value)


def _size(value: Any, cap: int) -> int:
    """Steps to handle ``value`` whole: one a node, one per ``REPR_STEP`` characters (up to cap)."""
    total = 0
    stack = [value]
    while stack and total <= cap:
        item = stack.pop()
        total += 1
        if isinstance(item, str):
            total += len(item) // REPR_STEP
        elif isinstance(item, Mapping):
            total += sum(len(k) for k in item) // REPR_STEP
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


@final
class SchemaCheck:
    """One server tool's compiled check; ``validate`` is the tool's ``validator``."""

    def __init__(self, cls: Any, schema: Mapping[str, Any], regexes: Mapping[str, Any]) -> None:
        from jsonschema import validators  # type: ignore[import-untyped]  # no py.typed
        from referencing import Registry

        self._regexes = dict(regexes)
        self._enums: dict[int, tuple[Any, frozenset[Any]]] = {}
        self._left = 0
        self._sizes: dict[int, int] = {}
        """Sizes of the values being checked, by ``id`` (they live as long as the check)."""
        replaced = {
            "additionalProperties": self._additional_properties,
            "enum": self._enum,
            "pattern": self._pattern,
            "patternProperties": self._pattern_properties,
            "properties": self._properties,
            "uniqueItems": self._unique_items,
        }
        keywords = {**cls.VALIDATORS, **replaced}
        spending = {name: self._spending(name, fn) for name, fn in keywords.items()}
        checker = validators.extend(cls, spending)
        self._validator = checker(schema, registry=Registry(), format_checker=None)

    def validate(self, arguments: Any) -> None:
        """Check ``arguments``.

        Raises:
            ArgumentsError: they violate the schema, or cost too much to check.
        """
        self._left = MAX_CHECK_STEPS
        try:
            error = next(iter(self._validator.iter_errors(arguments)), None)
        except _OverBudget:
            raise_for(
                "the arguments are too large or too complex to check against this tool's schema"
                f" (more than {MAX_CHECK_STEPS:,} steps)"
            )
        except RecursionError:
            raise_for("the arguments are nested too deeply to check against this tool's schema")
        except ArgumentsError:
            raise
        except Exception as exc:
            raise_for(f"the arguments could not be checked ({type(exc).__name__}: {exc})")
        finally:
            self._sizes = {}
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path)
            raise_for(f"{path}: {error.message}" if path else error.message)

    def _spending(self, name: str, keyword: Callable[..., Any]) -> Callable[..., Any]:
        iterating = name in _ITERATING
        descending = name in _DESCENDING
        base = REFERENCE_STEPS if name in ("$ref", "$dynamicRef", "$recursiveRef") else 1

        def spend(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            steps = base
            if iterating and isinstance(value, list | Mapping):
                steps += len(value)
            if descending and isinstance(instance, list | Mapping):
                steps += len(instance)
            self._spend(steps)
            errors = keyword(validator, value, instance, schema)
            return None if errors is None else self._paid(errors, instance)

        return spend

    def _paid(self, errors: Iterator[Any], instance: Any) -> Iterator[Any]:
        """``errors``, each paid for by the size of the value its message may quote."""
        for error in errors:
            self._spend(1 + self._weight(instance))
            yield error

    def _spend(self, steps: int) -> None:
        self._left -= steps
        if self._left < 0:
            raise _OverBudget

    def _weight(self, instance: Any) -> int:
        """Steps to pay for handling ``instance`` whole (quoting, hashing or matching it)."""
        if isinstance(instance, str):
            return len(instance) // REPR_STEP
        if not isinstance(instance, Mapping | list | tuple):
            return 0
        size = self._sizes.get(id(instance))
        if size is None:
            size = self._sizes[id(instance)] = _size(instance, self._left)
        return size

    def _regex(self, pattern: str) -> Any:
        regex = self._regexes.get(pattern)
        if regex is None:  # reached in a way the scan did not walk: compile it the same way
            regex = self._regexes[pattern] = compile_regexes({pattern})[pattern]
        return regex

    def _pattern(self, validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
        from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]

        if not isinstance(instance, str):
            return
        self._spend(self._weight(instance))
        if self._regex(pattern).search(instance) is None:
            yield ValidationError(f"{shown(instance)} does not match {shown(pattern)}")

    def _pattern_properties(
        self, validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not isinstance(instance, Mapping):
            return
        self._spend(len(patterns) * len(instance))
        for pattern, subschema in patterns.items():
            search = self._regex(pattern).search
            for key, value in instance.items():
                if search(key) is not None:
                    yield from validator.descend(value, subschema, path=key, schema_path=pattern)

    def _additional_properties(
        self, validator: Any, extra: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[Any]:
        from jsonschema.exceptions import ValidationError

        if not isinstance(instance, Mapping):
            return
        properties = schema.get("properties", {})
        searches = [self._regex(p).search for p in schema.get("patternProperties", {})]
        self._spend(len(searches) * len(instance))
        extras = [
            key
            for key in instance
            if key not in properties and not any(s(key) is not None for s in searches)
        ]
        if isinstance(extra, Mapping):
            for key in extras:
                yield from validator.descend(instance[key], extra, path=key)
        elif extra is False and extras:
            names = ", ".join(shown(k) for k in extras[:10])
            more = f" and {len(extras) - 10} more" if len(extras) > 10 else ""
            yield ValidationError(f"additional properties are not allowed ({names}{more})")

    def _properties(
        self, validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not isinstance(instance, Mapping):
            return
        if len(instance) < len(properties):
            names = [k for k in instance if k in properties]
        else:
            names = [k for k in properties if k in instance]
        for name in names:
            yield from validator.descend(
                instance[name], properties[name], path=name, schema_path=name
            )

    def _unique_items(
        self, validator: Any, unique: Any, instance: Any, schema: Any
    ) -> Iterator[Any]:
        from jsonschema.exceptions import ValidationError

        if unique is True and isinstance(instance, list):
            self._spend(self._weight(instance))
            seen: set[Any] = set()
            for item in instance:
                key = canonical(item)
                if key in seen:
                    yield ValidationError(f"the array has non-unique elements ({shown(item)})")
                    return
                seen.add(key)

    def _enum(self, validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[Any]:
        from jsonschema.exceptions import ValidationError

        self._spend(self._weight(instance))
        known = self._enums.get(id(enums))
        if known is None or known[0] is not enums:
            known = self._enums[id(enums)] = (enums, frozenset(canonical(e) for e in enums))
        if canonical(instance) not in known[1]:
            yield ValidationError(f"{shown(instance)} is not one of {shown(enums)}")
