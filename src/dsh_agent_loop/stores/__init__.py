"""Session store backends and store URLs.

``memory:`` → ``MemoryStore``; ``sqlite:///PATH`` → ``SqliteStore``; ``jsonl:///DIR`` →
``JsonlStore``; ``postgresql://…`` → ``PostgresStore`` (extra ``postgres``; import it from
``dsh_agent_loop.stores.postgres``, it is not loaded here).
"""

from __future__ import annotations

from .jsonl import JsonlStore as JsonlStore
from .memory import MemoryStore as MemoryStore
from .sqlite import SqliteStore as SqliteStore
from .url import store_from_url as store_from_url

__all__ = ["JsonlStore", "MemoryStore", "SqliteStore", "store_from_url"]
