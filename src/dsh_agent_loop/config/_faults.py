"""Faults: cattrs validation errors as key paths and messages, raised as one line.

Every fault is mapped back to its key path as written in the file, sorted in file order and
raised as one ``ConfigError``: ``FILE: key.path: message`` joined by ``; ``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)

from .._errors import ConfigError
from ._keys import allowed_keys, closest_key, key_names
from ._rules import Fault, Invalid, KeyPath

__all__ = ["faults_of", "raise_faults", "render"]


def _note(exc: BaseException, cls: type[Any]) -> Any:
    return next((n for n in getattr(exc, "__notes__", ()) if type(n) is cls), None)


def faults_of(exc: BaseException, path: KeyPath) -> Iterator[Fault]:
    """Every fault inside a cattrs validation error, with its path as written in the file."""
    if isinstance(exc, ClassValidationError):
        keys = key_names(exc.cl)
        written: dict[str, str] = getattr(exc, "written_keys", {})
        for sub in exc.exceptions:
            attribute = _note(sub, AttributeValidationNote)
            if attribute is not None:
                key = keys.get(attribute.name, attribute.name)
                yield from faults_of(sub, (*path, written.get(key, key)))
            elif isinstance(sub, ForbiddenExtraKeysError):
                for key in sub.extra_fields:
                    yield (*path, str(key)), _unknown_key(str(key), exc.cl)
            else:
                yield from faults_of(sub, path)
    elif isinstance(exc, IterableValidationError):
        for sub in exc.exceptions:
            element = _note(sub, IterableValidationNote)
            yield from faults_of(sub, path if element is None else (*path, element.index))
    elif isinstance(exc, Invalid):
        yield (*path, *exc.subpath), exc.message
    elif isinstance(exc, KeyError):
        yield path, "required key missing"
    else:
        yield path, str(exc) or type(exc).__name__


def _unknown_key(key: str, cl: type) -> str:
    allowed = tuple(allowed_keys(cl))
    close = closest_key(key, allowed)
    hint = f"did you mean {close!r}? " if close is not None else ""
    return f"unknown key ({hint}allowed: {', '.join(allowed)})"


_PLAIN_KEY = re.compile(r"[A-Za-z_@][\w@/-]*")


def render(path: KeyPath) -> str:
    """A key path as written in messages: ``plugins[0].config``, ``providers['a.b']``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _position(raw: Any, path: KeyPath) -> tuple[int, ...]:
    """Where ``path`` is in the raw tree, so faults come out in file order."""
    out: list[int] = []
    node = raw
    for part in path:
        if isinstance(node, Mapping):
            keys = [str(k) for k in node]
            index = keys.index(part) if part in keys else len(keys)
            node = list(node.values())[index] if index < len(keys) else None
        elif isinstance(node, list | tuple) and isinstance(part, int) and part < len(node):
            index, node = part, node[part]
        else:
            index, node = 0, None
        out.append(index)
    return tuple(out)


def raise_faults(faults: Iterable[Fault], raw: Any, label: str) -> None:
    """Raise every fault as one ``ConfigError`` line, in file order; nothing when none.

    Raises:
        ConfigError: ``LABEL: key.path: message`` joined by ``; ``.
    """
    unique = list(dict.fromkeys(faults))
    if not unique:
        return
    unique.sort(key=lambda fault: _position(raw, fault[0]))
    raise ConfigError(
        "; ".join(
            f"{label}: {render(path)}: {message}" if path else f"{label}: {message}"
            for path, message in unique
        )
    )
