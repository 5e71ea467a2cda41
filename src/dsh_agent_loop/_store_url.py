"""Store URLs read as plain data: which store a URL names, where, and with which options.

``memory`` / ``memory:`` → ``MemoryStore``; ``sqlite:///PATH`` → ``SqliteStore`` and
``jsonl:///PATH`` → ``JsonlStore``, where PATH is everything after the third slash up to a ``?``
(relative to the working directory, so ``sqlite:////abs/x.db`` is absolute);
``postgresql://…`` or ``postgres://…`` → ``PostgresStore`` (needs the ``postgres`` extra).

A query string carries the store's constructor options, so a URL alone can say everything a
config file or ``--store`` needs: ``sqlite:///s.db?durability=full&busy_timeout=10``,
``jsonl:///logs?close_timeout=5``, ``postgresql://u@h/db?table_prefix=app_&lease_ttl=15``.
A PostgreSQL URL may also hold libpq's own parameters (``sslmode``, ``connect_timeout``, ...);
those stay in the URL psycopg receives, the store's options are taken out. An unknown key, a
key given twice or a bad value is a ``StoreUrlError`` naming the key and listing the known ones,
raised when the URL is read, never when the store is first used.

Reading a URL builds nothing, so this module sits below every package: the config's rules check
a ``store`` URL with it, and ``stores.url.store_from_url`` builds the store it names.
"""

from __future__ import annotations

import difflib
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs

from ._frozen import FrozenDict

__all__ = ["STORE_URL_OPTIONS", "StoreUrl", "StoreUrlError", "parse_store_url"]

_FORMS = "memory:, sqlite:///PATH, jsonl:///PATH, postgresql://..."


@final
class StoreUrlError(ValueError):
    """A store URL that names no store: a bad form, an unknown option or a bad option value."""


def _seconds(key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise StoreUrlError(f"{key} must be a positive number of seconds, got {text!r}")
    return value


def _durability(key: str, text: str) -> str:
    if text not in ("normal", "full"):
        raise StoreUrlError(f"{key} must be 'normal' or 'full', got {text!r}")
    return text


_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def _table_prefix(key: str, text: str) -> str:
    if not _PREFIX.fullmatch(text):
        raise StoreUrlError(
            f"{key} must match [a-z_][a-z0-9_]* (at most 41 characters), got {text!r}"
        )
    return text


_Option = Callable[[str, str], Any]

#: The query-string options of each URL scheme, and how each value is read.
STORE_URL_OPTIONS: Final[Mapping[str, Mapping[str, _Option]]] = FrozenDict(
    sqlite=FrozenDict(durability=_durability, busy_timeout=_seconds, close_timeout=_seconds),
    jsonl=FrozenDict(close_timeout=_seconds),
    postgresql=FrozenDict(table_prefix=_table_prefix, lease_ttl=_seconds, close_timeout=_seconds),
)


@final
@attrs.frozen
class StoreUrl:
    """A parsed store URL: which store, where, and its constructor options."""

    scheme: str
    """``memory``, ``sqlite``, ``jsonl`` or ``postgresql`` (``postgres`` is read as this)."""
    target: str
    """The path (sqlite, jsonl), the URL psycopg receives (postgresql), or ``""`` (memory)."""
    options: Mapping[str, Any] = attrs.field(factory=FrozenDict)
    """Keyword arguments of the store's constructor, read from the query string."""


def _libpq_keys() -> frozenset[str] | None:
    """The connection parameters libpq knows, or None when psycopg is not installed."""
    try:
        from psycopg import pq
    except ImportError:
        return None
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def _unknown(url: str, key: str, known: list[str], libpq: frozenset[str] | None) -> StoreUrlError:
    close = difflib.get_close_matches(key, [*known, *sorted(libpq or ())], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listed = ", ".join(known) if known else "none"
    extra = ", or a libpq connection parameter" if libpq else ""
    return StoreUrlError(
        f"bad store URL {url!r}: unknown option {key!r} ({hint}known: {listed}{extra})"
    )


def _options(url: str, scheme: str, query: str) -> tuple[dict[str, Any], list[str]]:
    """The store's options in ``query``, and the query's other ``key=value`` parts (libpq's)."""
    table = STORE_URL_OPTIONS[scheme]
    libpq = _libpq_keys() if scheme == "postgresql" else None
    options: dict[str, Any] = {}
    rest: list[str] = []
    seen: set[str] = set()
    for part in query.split("&") if query else ():
        raw_key, eq, raw_value = part.partition("=")
        key = urllib.parse.unquote(raw_key)
        if not eq or not key:
            raise StoreUrlError(f"bad store URL {url!r}: expected key=value, got {part!r}")
        if key in seen:
            raise StoreUrlError(f"bad store URL {url!r}: option {key!r} is given twice")
        seen.add(key)
        if key in table:
            value = urllib.parse.unquote(raw_value)
            try:
                options[key] = table[key](key, value)
            except StoreUrlError as exc:
                raise StoreUrlError(f"bad store URL {url!r}: {exc}") from None
        elif scheme == "postgresql" and (libpq is None or key in libpq):
            rest.append(part)
        else:
            raise _unknown(url, key, list(table), libpq)
    return options, rest


def _path_after(url: str, scheme: str) -> tuple[str, str]:
    prefix = f"{scheme}:///"
    if not url.startswith(prefix):
        raise StoreUrlError(
            f"bad store URL {url!r}: write {scheme}:///relative/path or {scheme}:////absolute/path"
        )
    path, _, query = url[len(prefix) :].partition("?")
    if not path:
        raise StoreUrlError(f"bad store URL {url!r}: the path is empty")
    return path, query


def parse_store_url(url: str) -> StoreUrl:
    """Read ``url`` without building or opening anything.

    Raises:
        StoreUrlError: (a ``ValueError``) not one of the supported forms, an unknown or
            repeated option, or a bad option value; the message names the key and lists the
            known ones.
    """
    scheme, sep, _ = url.partition(":")
    scheme = scheme.lower() if sep else url.lower()
    if scheme == "memory":
        if url.lower() not in ("memory", "memory:", "memory://"):
            raise StoreUrlError(f"bad store URL {url!r}: a memory store takes no path or options")
        return StoreUrl("memory", "")
    if scheme in ("sqlite", "jsonl"):
        path, query = _path_after(url, scheme)
        options, _ = _options(url, scheme, query)
        return StoreUrl(scheme, path, FrozenDict(options))
    if scheme in ("postgresql", "postgres"):
        if not url.startswith(f"{url[: len(scheme)]}://"):
            raise StoreUrlError(f"bad store URL {url!r}: write {scheme}://user@host/dbname")
        base, _, query = url.partition("?")
        options, rest = _options(url, "postgresql", query)
        dsn = url if not options else base + ("?" + "&".join(rest) if rest else "")
        return StoreUrl("postgresql", dsn, FrozenDict(options))
    raise StoreUrlError(f"unsupported store URL {url!r}; use one of: {_FORMS}")
