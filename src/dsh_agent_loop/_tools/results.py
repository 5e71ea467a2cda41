r"""Checking what a tool handed back: a result the log can hold and every store can encode.

One agent's bad data must never stop the others (docs/reliability.md#failures-stay-local). Whatever
a handler (or
``tools/execute`` / ``tools/post-execute`` middleware) returns is checked once, before it is
committed, by these rules:

- A plain ``str`` and a ``ToolResult`` whose fields have their declared types are kept.
- Text that holds surrogate code points (``'\ud800'``: not Unicode scalar values, so not
  encodable as UTF-8, and refused by every store) is kept with each such code point replaced by
  its escape as literal text (the six characters ``\ud800``). This applies to the content, the
  error code, the ``additional_contexts`` texts and the strings (keys and values) inside ``meta``.
- Anything else — ``bytes``, ``None`` or another object as the result or its ``content``, a
  ``meta`` that is not a mapping of JSON values (a set, an object, a non-finite float, a
  non-string key, a cycle), a non-bool ``concludes_turn`` — is replaced by a ``TOOL_ERROR``
  result whose text (``Error: InvalidToolResult: <problem>``, bounded to ``MAX_ECHO``
  characters) tells the model what was wrong. ``@tool`` functions return any JSON value; one
  JSON cannot hold raises ``InvalidToolResult`` there, which makes the same result.

The common case costs a type check and ``str.isascii()``: this runs once per tool call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import attrs

from .._frozen import FrozenDict
from .base import MAX_ECHO, InvalidToolResult, ToolResult

__all__ = [
    "INVALID_RESULT",
    "bounded_text",
    "checked_result",
    "escape_surrogates",
    "exception_text",
    "invalid_result",
]

#: The ``error.name`` of a result replaced because it was not valid.
INVALID_RESULT: Final = InvalidToolResult.__name__
#: Deepest ``meta`` nesting accepted (deeper data is refused, as a cycle is).
MAX_META_DEPTH: Final = 100
#: What ends a tool result cut to ``Limits.max_tool_result_bytes``.
TRUNCATION_MARKER: Final = (
    "\n[tool result truncated: it was {total} bytes; the first {kept} bytes are shown]"
)


def bounded_text(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` of UTF-8, ending with ``TRUNCATION_MARKER`` when cut.

    The cut never splits a character. One length test in the usual case: a code point is at
    most four bytes.
    """
    if len(text) <= max_bytes >> 2:
        return text
    data = text.encode("utf-8", "backslashreplace")
    total = len(data)
    if total <= max_bytes:
        return text
    # The kept count has at most as many digits as max_bytes: the marker cannot grow past this.
    keep = max(0, max_bytes - len(TRUNCATION_MARKER.format(total=total, kept=max_bytes)))
    head = data[:keep].decode("utf-8", "ignore")
    kept = len(head.encode("utf-8"))
    return head + TRUNCATION_MARKER.format(total=total, kept=kept)


def escape_surrogates(text: str) -> str:
    r"""``text`` with each surrogate code point written as its escape (``\ud800``).

    Returns ``text`` itself, as an exact ``str``, when it holds none (the usual case).
    """
    if type(text) is not str:
        text = str.__str__(text)  # a str subclass: its plain value, never its __str__
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class _Invalid(Exception):
    """Why a returned value is not a valid result (text for the model)."""


def _type_name(value: object) -> str:
    return type(value).__name__


def checked_result(value: object) -> tuple[ToolResult | str, str | None]:
    """Check a returned value; returns the result to commit and, if it was invalid, an error name.

    A valid value comes back as is (texts escaped, ``meta`` frozen); an invalid one as a
    ``TOOL_ERROR`` result explaining the problem, with error name ``INVALID_RESULT``.
    """
    if type(value) is str:
        return (value if value.isascii() else escape_surrogates(value)), None
    try:
        if isinstance(value, str):
            return escape_surrogates(value), None
        if isinstance(value, ToolResult):
            return _checked_tool_result(value), None
        raise _Invalid(f"the tool returned {_type_name(value)}, not a str or a ToolResult")
    except _Invalid as exc:
        return invalid_result(str(exc)), INVALID_RESULT
    except Exception as exc:  # reading it failed (a Mapping whose items() raises, ...)
        return invalid_result(f"reading it raised {exception_text(exc)}"), INVALID_RESULT


def invalid_result(problem: str) -> ToolResult:
    """The ``TOOL_ERROR`` result that replaces an invalid one (text bounded in size)."""
    text = f"Error: {INVALID_RESULT}: {problem}"
    if len(text) > MAX_ECHO:
        text = text[:MAX_ECHO] + "…"
    return ToolResult(escape_surrogates(text), error="TOOL_ERROR")


def _checked_tool_result(result: ToolResult) -> ToolResult:
    content = _text(result.content, "content")
    error = None if result.error is None else _text(result.error, "error")
    if type(result.concludes_turn) is not bool:
        raise _Invalid(f"concludes_turn is {_type_name(result.concludes_turn)}, not a bool")
    contexts = result.additional_contexts
    if contexts:
        if type(contexts) is not tuple:  # the field's converter makes one unless bypassed
            raise _Invalid(f"additional_contexts is {_type_name(contexts)}, not a tuple of str")
        contexts = tuple([_text(t, f"additional_contexts[{i}]") for i, t in enumerate(contexts)])
    meta = result.meta
    if meta is not None:
        if not isinstance(meta, Mapping):
            raise _Invalid(f"meta is {_type_name(meta)}, not a mapping")
        meta = _json_value(meta, "meta", set(), 0)
    if (
        content is result.content
        and error is result.error
        and meta is result.meta
        and contexts == result.additional_contexts  # equal: escaping changed nothing
    ):
        return result
    return attrs.evolve(
        result, content=content, error=error, additional_contexts=contexts, meta=meta
    )


def _text(value: object, field: str) -> str:
    if type(value) is str and value.isascii():
        return value
    if not isinstance(value, str):
        raise _Invalid(f"{field} is {_type_name(value)}, not a str")
    return escape_surrogates(value)


def _json_value(value: Any, path: str, active: set[int], depth: int) -> Any:
    """``value`` deep-frozen, texts escaped; raises ``_Invalid`` naming the first bad part."""
    cls = type(value)
    if cls is str:
        return value if value.isascii() else escape_surrogates(value)
    if cls is bool or cls is int or value is None:
        return value
    if cls is float:
        if not math.isfinite(value):
            raise _Invalid(f"{path} is {value!r}, not a finite number (JSON has no {value!r})")
        return value
    if isinstance(value, Mapping | list | tuple):
        if depth >= MAX_META_DEPTH:
            raise _Invalid(f"{path} is nested more than {MAX_META_DEPTH} levels deep")
        if id(value) in active:
            raise _Invalid(f"{path} contains itself (a cycle)")
        active.add(id(value))
        try:
            return _json_container(value, path, active, depth + 1)
        finally:
            active.discard(id(value))
    # Subclasses of the JSON types (a StrEnum, an IntEnum): their plain values.
    if isinstance(value, str):
        return escape_surrogates(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return _json_value(float.__float__(value), path, active, depth)
    raise _Invalid(f"{path} holds a {_type_name(value)}, which is not JSON")


def _json_container(value: Any, path: str, active: set[int], depth: int) -> Any:
    if not isinstance(value, Mapping):
        return tuple(
            [_json_value(item, f"{path}[{i}]", active, depth) for i, item in enumerate(value)]
        )
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _Invalid(f"{path} has a {_type_name(key)} key, not a str")
        name = escape_surrogates(key)
        if name in out:
            raise _Invalid(f"{path} has two keys that read {name!r}")
        out[name] = _json_value(item, f"{path}[{name!r}]", active, depth)
    return FrozenDict(out)


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, even when its ``__str__`` raises or returns a non-str."""
    name = escape_surrogates(type(exc).__name__)
    try:
        message = str(exc)
    except Exception as failure:  # __str__ raised, or returned something that is not a str
        return f"{name} (its message could not be read: {_type_name(failure)})"
    return f"{name}: {escape_surrogates(message)}"
