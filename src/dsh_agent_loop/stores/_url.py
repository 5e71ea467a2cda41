"""``store_from_url``: build a session store from its URL, options included.

``memory`` / ``memory:`` → ``MemoryStore``; ``sqlite:///PATH`` → ``SqliteStore`` and
``jsonl:///PATH`` → ``JsonlStore``, where PATH is everything after the third slash up to a ``?``
(relative to the working directory, so ``sqlite:////abs/x.db`` is absolute);
``postgresql://…`` or ``postgres://…`` → ``PostgresStore`` (needs the ``postgres`` extra).

A query string carries the store's constructor options (``sqlite:///s.db?durability=full``).
Reading a URL (``parse_store_url``, ``StoreUrlError``, ``STORE_URL_OPTIONS``) builds nothing and
lives below every package, so the config's rules use it too; they are re-exported here.
"""

from __future__ import annotations

from .._session.store import SessionStore
from .._store_url import STORE_URL_OPTIONS as STORE_URL_OPTIONS
from .._store_url import StoreUrl as StoreUrl
from .._store_url import StoreUrlError as StoreUrlError
from .._store_url import parse_store_url as parse_store_url

__all__ = ["STORE_URL_OPTIONS", "StoreUrl", "StoreUrlError", "parse_store_url", "store_from_url"]


def store_from_url(url: str) -> SessionStore:
    """Return the store that ``url`` names, built with its options; nothing is opened yet.

    Raises:
        StoreUrlError: (a ``ValueError``) see ``parse_store_url``.
        ImportError: a PostgreSQL URL without the ``postgres`` extra (psycopg) installed.
    """
    parsed = parse_store_url(url)
    options = dict(parsed.options)
    if parsed.scheme == "memory":
        from ._memory import MemoryStore

        return MemoryStore()
    if parsed.scheme == "sqlite":
        from .sqlite import SqliteStore

        return SqliteStore(parsed.target, **options)
    if parsed.scheme == "jsonl":
        from ._jsonl import JsonlStore

        return JsonlStore(parsed.target, **options)
    try:
        from .postgres import PostgresStore
    except ImportError as exc:
        raise ImportError(
            f"store URL {url!r} needs psycopg: install dsh-agent-loop[postgres]"
        ) from exc
    return PostgresStore(parsed.target, **options)
