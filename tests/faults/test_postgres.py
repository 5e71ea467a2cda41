"""Fault corpus: a PostgreSQL connection lost mid-session (docs/design.md#store-failures).

Needs ``DSH_TEST_POSTGRES_DSN`` (skipped otherwise). Between two turns, every server backend of
the store's connections is terminated from outside; the next commits retry on a new connection
with backoff, and each stored log is complete, dense and free of duplicates.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import trio

from dsh_agent_loop import Reply, ScriptedModel

from ..stores.conftest import drop_pg_tables, new_pg_prefix, postgres_dsn
from ._kit import (
    BYSTANDER_SESSION,
    VICTIM_SESSION,
    assert_well_formed,
    open_pair,
    stored_log,
    turn_ends,
)


def _with_app_name(dsn: str, name: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


def _terminate(dsn: str, name: str) -> int:
    """Terminate the server backends of this test's store (by application name)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchall()
    return len(rows)


async def test_connection_lost_between_turns(tmp_path: Path) -> None:
    from dsh_agent_loop.stores.postgres import PostgresStore

    dsn, prefix = postgres_dsn(), new_pg_prefix()
    app = f"{prefix}victim"
    store = PostgresStore(_with_app_name(dsn, app), table_prefix=prefix)
    model = ScriptedModel(
        [
            Reply.tool_calls(("note", {"text": "1"})),
            Reply.text("first"),
            Reply.tool_calls(("note", {"text": "2"})),
            Reply.text("second"),
        ]
    )
    try:
        with trio.fail_after(60):
            async with open_pair(model, store=store) as pair:
                pair.victim.agent.followup("one")
                await pair.victim.agent.wait_idle()
                killed = await trio.to_thread.run_sync(_terminate, dsn, app)
                assert killed >= 1
                await pair.run_both(victim_prompt="two")
                assert pair.victim_errors() == []
                assert pair.bystander_errors() == []
        reader = PostgresStore(dsn, table_prefix=prefix)
        try:
            victim = await stored_log(reader, "memory", tmp_path, VICTIM_SESSION)
            bystander = await stored_log(reader, "memory", tmp_path, BYSTANDER_SESSION)
        finally:
            await reader.aclose()
        assert_well_formed(victim)
        assert_well_formed(bystander)
        assert turn_ends(victim) == [{"kind": "completed"}, {"kind": "completed"}]
        assert turn_ends(bystander) == [{"kind": "completed"}]
    finally:
        await store.aclose()
        await trio.to_thread.run_sync(drop_pg_tables, dsn, prefix)
