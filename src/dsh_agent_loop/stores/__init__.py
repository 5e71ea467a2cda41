"""Session stores, for people who pick one or write one.

Store authors implement ``SessionStore`` (with its ``ReadHandle`` and ``WriteHandle``) and return
``SessionInfo``/``StoreStatistics`` records; docs/design.md#store-protocol is the contract. The
built-in stores: ``memory:`` → ``MemoryStore``; ``sqlite:///PATH`` → ``SqliteStore`` (also
``dsh_agent_loop.stores.sqlite``); ``jsonl:///DIR`` → ``JsonlStore``; ``postgresql://…`` →
``PostgresStore`` (extra ``postgres``; import it from ``dsh_agent_loop.stores.postgres``, it is not
loaded here). ``store_from_url``/``parse_store_url`` read store URLs. The modules behind this face
are internal.
"""

from __future__ import annotations

from .._session.store import FORMAT_VERSION as FORMAT_VERSION
from .._session.store import ReadHandle as ReadHandle
from .._session.store import SessionInfo as SessionInfo
from .._session.store import SessionStore as SessionStore
from .._session.store import StoreStatistics as StoreStatistics
from .._session.store import WriteHandle as WriteHandle
from .._session.store import info_from_events as info_from_events
from ._jsonl import JsonlStore as JsonlStore
from ._memory import MemoryStore as MemoryStore
from ._url import STORE_URL_OPTIONS as STORE_URL_OPTIONS
from ._url import StoreUrl as StoreUrl
from ._url import StoreUrlError as StoreUrlError
from ._url import parse_store_url as parse_store_url
from ._url import store_from_url as store_from_url
from .sqlite import SqliteStore as SqliteStore

__all__ = [
    "FORMAT_VERSION",
    "STORE_URL_OPTIONS",
    "JsonlStore",
    "MemoryStore",
    "ReadHandle",
    "SessionInfo",
    "SessionStore",
    "SqliteStore",
    "StoreStatistics",
    "StoreUrl",
    "StoreUrlError",
    "WriteHandle",
    "info_from_events",
    "parse_store_url",
    "store_from_url",
]
