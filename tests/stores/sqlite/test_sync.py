"""``stores/sqlite/_sync.py``: the schema; files made by the first schema still open."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.stores import SqliteStore

from ..conftest import ev, header

#: The first schema's ``sessions`` table, with its never-updated ``event_count`` column.
OLD_SESSIONS = """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    header TEXT NOT NULL,
    event_count INTEGER NOT NULL DEFAULT 0,
    last_turn_end TEXT
)
"""


def _columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as raw:
        names = [row[1] for row in raw.execute("PRAGMA table_info(sessions)")]
    raw.close()
    return names


async def test_a_new_file_has_no_event_count_column(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.close()
    assert _columns(path) == [
        "session_id",
        "agent_id",
        "created_at",
        "header",
        "last_turn_end",
    ]


async def test_a_file_of_the_first_schema_opens_and_its_event_count_is_ignored(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path, isolation_level=None) as raw:
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute(OLD_SESSIONS)
        head = header("s1")
        raw.execute(
            "INSERT INTO sessions VALUES (?,?,?,?,?,NULL)",
            ("s1", head["agent_id"], head["created_at"], json.dumps(head), 99),
        )
        raw.execute(
            "CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL,"
            " type TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (session_id, seq))"
            " WITHOUT ROWID"
        )
        for i in range(3):
            raw.execute(
                "INSERT INTO events VALUES ('s1', ?, 'user/message', ?)",
                (i, event_to_json(ev(i))),
            )
    raw.close()
    async with SqliteStore(path) as store:
        info = await store.stat("s1")
        assert info is not None
        assert info.event_count == 3  # from the events, not the stale column
        empty = await store.create(header("never-flushed"))  # the column's default fills it
        assert [i.session_id for i in await store.list()] == ["s1"]
        reopened = await store.open("s1", "write")
        await reopened.append([ev(3), ev(4, "turn/end", reason={"kind": "completed"})])
        await reopened.close()
        await empty.close()  # drops the empty session: it stays unknown
        assert await store.stat("never-flushed") is None
        reader = await store.open("s1", "read")
        assert await reader.read() == [
            *(ev(i) for i in range(4)),
            ev(4, "turn/end", reason={"kind": "completed"}),
        ]
        info = await store.stat("s1")
        assert info is not None
        assert (info.event_count, info.last_turn_end) == (5, {"kind": "completed"})
    assert "event_count" in _columns(path)  # an old file keeps its shape
