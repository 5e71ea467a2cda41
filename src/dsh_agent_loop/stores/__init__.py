"""Session store backends and store URLs.

``memory:`` → ``MemoryStore``; ``sqlite:///PATH`` → ``SqliteStore``; ``jsonl:///DIR`` →
``JsonlStore``; ``postgresql://…`` → ``PostgresStore`` (extra ``postgres``).
"""

from __future__ import annotations

from .memory import MemoryStore as MemoryStore

__all__ = ["MemoryStore"]
