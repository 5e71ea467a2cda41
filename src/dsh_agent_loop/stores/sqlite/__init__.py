"""``SqliteStore``: the embedded default backend (one SQLite file, WAL, group commit).

Modules: ``store`` (the ``SessionStore``), ``_connections`` (the writer and reader
connections, one worker-thread hop per call), ``_reads`` (concurrent reads sharing hops),
``_commit`` (the write path: group-commit rounds, grouped releases, and how a failed round is
settled), ``_checkpoint`` (the background WAL checkpoint and its
thread), ``_owner_lock`` (each owning store's lock on ``<path>-owners``: proof that an owner is
alive, across PID namespaces), ``_sync`` (the schema and every transaction, trio-free).
"""

from __future__ import annotations

from ._store import SqliteStore as SqliteStore
from ._store import SqliteStoreStatistics as SqliteStoreStatistics

__all__ = ["SqliteStore", "SqliteStoreStatistics"]
