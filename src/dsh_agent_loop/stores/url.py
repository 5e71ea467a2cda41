"""``store_from_url``: build a session store from its URL.

``memory`` / ``memory:`` → ``MemoryStore``; ``sqlite:///PATH`` → ``SqliteStore`` and
``jsonl:///PATH`` → ``JsonlStore``, where PATH is everything after the third slash (relative
to the working directory, so ``sqlite:////abs/x.db`` is absolute); ``postgresql://…`` or
``postgres://…`` → ``PostgresStore`` with the URL unchanged (needs the ``postgres`` extra).
"""

from __future__ import annotations

from ..session.store import SessionStore
from .jsonl import JsonlStore
from .memory import MemoryStore
from .sqlite import SqliteStore

__all__ = ["store_from_url"]

_FORMS = "memory:, sqlite:///PATH, jsonl:///PATH, postgresql://..."


def _path_after(url: str, scheme: str) -> str:
    prefix = f"{scheme}:///"
    if not url.startswith(prefix):
        raise ValueError(
            f"bad store URL {url!r}: write {scheme}:///relative/path or {scheme}:////absolute/path"
        )
    path = url[len(prefix) :]
    if not path:
        raise ValueError(f"bad store URL {url!r}: the path is empty")
    return path


def store_from_url(url: str) -> SessionStore:
    """Return the store that ``url`` names; nothing is opened until it is used.

    Raises:
        ValueError: ``url`` is not one of the supported forms.
        ImportError: a PostgreSQL URL without the ``postgres`` extra (psycopg) installed.
    """
    scheme, sep, _ = url.partition(":")
    scheme = scheme.lower() if sep else url.lower()
    if scheme == "memory":
        if url.lower() not in ("memory", "memory:", "memory://"):
            raise ValueError(f"bad store URL {url!r}: a memory store takes no path")
        return MemoryStore()
    if scheme == "sqlite":
        return SqliteStore(_path_after(url, "sqlite"))
    if scheme == "jsonl":
        return JsonlStore(_path_after(url, "jsonl"))
    if scheme in ("postgresql", "postgres"):
        if not url.startswith(f"{url[: len(scheme)]}://"):
            raise ValueError(f"bad store URL {url!r}: write {scheme}://user@host/dbname")
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise ImportError(
                f"store URL {url!r} needs psycopg: install dsh-agent-loop[postgres]"
            ) from exc
        return PostgresStore(url)
    raise ValueError(f"unsupported store URL {url!r}; use one of: {_FORMS}")
