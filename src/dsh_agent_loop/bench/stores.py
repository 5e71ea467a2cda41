"""The store benchmark: what durability costs the loop, and how near raw SQL the commit path is.

- W1 on ``SqliteStore`` against W1 on ``MemoryStore`` (``loop.w1(1000)``, best of 3 each,
  interleaved): µs/step and their ratio (target ≤ 2×). Every step flushes once before its
  tool runs, so this is the price of one durable commit per step.
- Append throughput: many sessions at once, each appending batches of 3 events and flushing
  each batch through its ``WriteHandle`` (so the store group-commits what queues up), in
  events/s; against plain ``sqlite3``: the same rows (JSON text included, encoded with
  ``json.dumps`` as plain code would) inserted with ``executemany`` into the same table in WAL
  mode with ``synchronous=NORMAL``, one transaction per group of the size the store's commits
  averaged in the same run (target ≥ 50%).
- The floor under the first figure, measured in the same run: every step must make its
  ``tool/call`` durable before the tool runs, and the store keeps SQLite off the trio thread,
  so a step costs at least W1 on a memory store whose every commit also makes one empty round
  trip to the stores' worker thread, plus one plain ``sqlite3`` commit of a step's rows (five
  rows, WAL/NORMAL). ``floor / memory`` shows which ratio this machine allows at all.
- The same figures for ``PostgresStore`` when ``DSH_TEST_POSTGRES_DSN`` is set (own tables,
  dropped afterwards): raw is ``psycopg`` ``executemany``, one transaction per group of the
  size a store commit had (one batch: that store commits each handle on its own connection).

Run ``python -m dsh_agent_loop.bench.stores [--quick] [--json PATH]`` (in a source checkout,
``scripts/bench/stores.py`` is a wrapper around it), or ``dsh-agent bench``.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import outcome
import trio

from dsh_agent_loop.bench.loop import report, w1
from dsh_agent_loop.events import Event, event_to_json
from dsh_agent_loop.stores import MemoryStore, SessionStore, WriteHandle
from dsh_agent_loop.stores.sqlite import SqliteStore

__all__ = ["append_throughput", "main", "raw_sqlite_throughput", "run_store_bench"]

PG_ENV = "DSH_TEST_POSTGRES_DSN"
W1_STEPS = 1000
BATCH = 3


def _batch_docs(session: int, first: int) -> list[dict[str, Any]]:
    """Three events shaped like a tool step's (result, step end, next call), as plain dicts."""
    base = {"turn": 1, "step": first // BATCH}
    call_id = f"call-{session}-{first}"
    content = [{"type": "text", "text": "ok " * 20}]
    now = time.time()
    message = {"role": "tool", "call_id": call_id, "content": content}
    arguments = '{"query": "trio nursery"}'
    result = {"type": "tool/result", "seq": first, "time": now}
    return [
        {**result, "data": {**base, "message": message}, "source_event_seqs": [first]},
        {"type": "step/end", "seq": first + 1, "time": now, "data": base},
        {
            "type": "tool/call",
            "seq": first + 2,
            "time": now,
            "data": {**base, "call_id": call_id, "arguments": arguments},
        },
    ]


def _batch(session: int, first: int) -> list[Event]:
    """``_batch_docs`` as events."""
    return [
        Event(
            doc["type"],
            doc["seq"],
            doc["time"],
            doc["data"],
            source_event_seqs=tuple(doc["source_event_seqs"])
            if "source_event_seqs" in doc
            else None,
        )
        for doc in _batch_docs(session, first)
    ]


def _header(sid: str) -> dict[str, Any]:
    return {"session_id": sid, "agent_id": "bench", "created_at": "2026-01-01T00:00:00Z"}


# --- append throughput --------------------------------------------------------------------------


def append_throughput(
    make_store: Callable[[], SessionStore], sessions: int, batches: int
) -> tuple[float, float]:
    """(events/s, average batches per commit) for ``sessions`` concurrent appending handles."""

    async def writer(handle: WriteHandle, index: int) -> None:
        for b in range(batches):
            await handle.append(_batch(index, b * BATCH))
            await handle.flush()

    async def run() -> tuple[float, float]:
        store = make_store()
        try:
            run = secrets.token_hex(4)
            handles = [await store.create(_header(f"tp-{run}-{i}")) for i in range(sessions)]
            commits_before = _commits(store)
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i, handle in enumerate(handles):
                    nursery.start_soon(writer, handle, i)
            elapsed = time.perf_counter() - start
            commits = _commits(store) - commits_before
            for handle in handles:
                await handle.close()
        finally:
            await store.aclose()
        group = sessions * batches / commits if commits else 1.0
        return sessions * batches * BATCH / elapsed, group

    return trio.run(run)


def _commits(store: SessionStore) -> int:
    return store.statistics().commits if isinstance(store, SqliteStore) else 0


Row = tuple[str, int, str, str]


def _raw_rows(sessions: int, batches: int) -> Iterator[list[Row]]:
    """Per round: every session's next batch, as rows, the JSON made by plain ``json.dumps``."""
    for b in range(batches):
        rows: list[Row] = []
        for i in range(sessions):
            for doc in _batch_docs(i, b * BATCH):
                text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
                rows.append((f"tp-{i}", doc["seq"], doc["type"], text))
        yield rows


def _groups(rows_by_round: Iterator[list[Row]], group: int) -> Iterator[list[Row]]:
    """Regroup the rows into transactions of ``group`` batches each."""
    pending: list[Row] = []
    for rows in rows_by_round:
        for k in range(0, len(rows), BATCH):
            pending.extend(rows[k : k + BATCH])
            if len(pending) >= group * BATCH:
                yield pending
                pending = []
    if pending:
        yield pending


def _raw_connection(path: str) -> sqlite3.Connection:
    """A plain ``sqlite3`` connection in WAL/NORMAL with the stores' events table."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS events (session_id TEXT NOT NULL, seq INTEGER NOT NULL,"
        " type TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (session_id, seq)) WITHOUT ROWID"
    )
    return conn


def _raw_commit(conn: sqlite3.Connection, rows: list[Row]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("INSERT INTO events VALUES (?,?,?,?)", rows)
    conn.execute("COMMIT")


def raw_sqlite_throughput(
    path: str, sessions: int, batches: int, group: float, *, encoded: bool = False
) -> float:
    """Events/s for plain ``sqlite3``: encode and ``executemany`` in WAL/NORMAL transactions.

    With ``encoded`` the rows are built before the clock starts (the database alone).
    """
    conn = _raw_connection(path)
    try:
        source = _raw_rows(sessions, batches)
        if encoded:
            source = iter(list(source))
        start = time.perf_counter()
        for rows in _groups(source, max(1, round(group))):
            _raw_commit(conn, rows)
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    return sessions * batches * BATCH / elapsed


def raw_postgres_throughput(dsn: str, sessions: int, batches: int) -> float:
    """Events/s for plain ``psycopg``: one batch per transaction, as the store commits them."""
    import psycopg

    table = f"bench_raw_{secrets.token_hex(4)}"
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f"CREATE TABLE {table} (session_id text NOT NULL, seq bigint NOT NULL,"
            " type text NOT NULL, json text NOT NULL, PRIMARY KEY (session_id, seq))"
        )
        conn.commit()
        try:
            start = time.perf_counter()
            for rows in _groups(_raw_rows(sessions, batches), 1):
                with conn.cursor() as cur:
                    cur.executemany(f"INSERT INTO {table} VALUES (%s,%s,%s,%s)", rows)
                conn.commit()
            elapsed = time.perf_counter() - start
        finally:
            conn.execute(f"DROP TABLE {table}")
            conn.commit()
    return sessions * batches * BATCH / elapsed


def _nothing() -> None:
    return None


async def _worker_hop() -> None:
    """One empty round trip to a cached worker thread, as the SQLite store makes per commit.

    The store hops with trio's thread cache directly (``trio.lowlevel.start_thread_soon``),
    not through ``trio.to_thread.run_sync``, whose fixed cost is larger; the floor makes the
    same hop with the same public primitives.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result: outcome.Outcome[None]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(_nothing, deliver)
    await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)


class _HopHandle:
    """A memory write handle whose commit also makes one empty worker-thread round trip."""

    def __init__(self, inner: WriteHandle) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def flush(self) -> None:
        await _worker_hop()
        await self._inner.flush()


class _HopStore:
    """``MemoryStore`` with ``_HopHandle`` write handles: the floor's store."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def create(self, header: Any, *, inherited_events: Any = ()) -> Any:
        return _HopHandle(await self._inner.create(header, inherited_events=inherited_events))

    async def open(self, session_id: str, mode: Any = "read") -> Any:
        handle = await self._inner.open(session_id, mode)
        return _HopHandle(handle) if mode == "write" else handle


def raw_step_commit_us(path: str, rounds: int = 2000) -> float:
    """µs for one plain ``sqlite3`` transaction of a W1 step's five rows, pre-encoded."""
    conn = _raw_connection(path)
    try:
        step = [e for b in (0, 1) for e in _batch(0, b * BATCH)][:5]
        texts = [event_to_json(e) for e in step]
        start = time.perf_counter()
        for r in range(rounds):
            rows = [("w1", r * 5 + i, e.type, texts[i]) for i, e in enumerate(step)]
            _raw_commit(conn, rows)
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    return elapsed / rounds * 1e6


# --- the run --------------------------------------------------------------------------------------


@contextmanager
def _postgres(dsn: str) -> Iterator[Callable[[], SessionStore]]:
    import psycopg

    from dsh_agent_loop.stores.postgres import PostgresStore

    prefix = f"bench_{secrets.token_hex(4)}_"
    try:
        yield lambda: PostgresStore(dsn, table_prefix=prefix)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("events", "sessions", "leases"):
                conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")


def run_store_bench(quick: bool = False) -> dict[str, Any]:
    """Run the store benchmark; returns the JSON record (PostgreSQL figures None without a DSN)."""
    repeats = 2 if quick else 3
    sessions, batches = (50, 20) if quick else (100, 50)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dsh-bench-stores-") as tmp:
        files = (str(Path(tmp) / f"w1-{i}.db") for i in range(1000))
        memory: list[float] = []
        sqlite: list[float] = []
        for _ in range(repeats):
            memory.append(w1(W1_STEPS, store_factory=MemoryStore))
            sqlite.append(w1(W1_STEPS, store_factory=lambda: SqliteStore(next(files))))
        result["memory_w1_us_per_step"] = min(memory) / W1_STEPS * 1e6
        result["sqlite_w1_us_per_step"] = min(sqlite) / W1_STEPS * 1e6
        result["sqlite_w1_ratio"] = min(sqlite) / min(memory)
        hop = min(w1(W1_STEPS, store_factory=_HopStore) for _ in range(repeats)) / W1_STEPS * 1e6
        commit = min(raw_step_commit_us(str(Path(tmp) / f"step-{i}.db")) for i in range(3))
        result["memory_hop_w1_us_per_step"] = hop
        result["sqlite_raw_step_commit_us"] = commit
        result["sqlite_w1_floor_us_per_step"] = hop + commit
        store_rates: list[float] = []
        raw_rates: list[float] = []
        encoded_rates: list[float] = []
        for i in range(repeats):
            path = str(Path(tmp) / f"tp-{i}.db")
            rate, group = append_throughput(partial(SqliteStore, path), sessions, batches)
            store_rates.append(rate)
            raw_path = str(Path(tmp) / f"raw-{i}.db")
            raw_rates.append(raw_sqlite_throughput(raw_path, sessions, batches, group))
            encoded_path = str(Path(tmp) / f"encoded-{i}.db")
            encoded_rates.append(
                raw_sqlite_throughput(encoded_path, sessions, batches, group, encoded=True)
            )
        result["sqlite_append_events_per_s"] = max(store_rates)
        result["sqlite_raw_events_per_s"] = max(raw_rates)
        result["sqlite_append_ratio"] = max(store_rates) / max(raw_rates)
        result["sqlite_raw_preencoded_events_per_s"] = max(encoded_rates)
        result["sqlite_batches_per_commit"] = group
    result.update(_postgres_figures(repeats, sessions, batches))
    return result


def _postgres_figures(repeats: int, sessions: int, batches: int) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "postgres_w1_us_per_step": None,
        "postgres_append_events_per_s": None,
        "postgres_raw_events_per_s": None,
    }
    dsn = os.environ.get(PG_ENV)
    if not dsn:
        return figures
    with _postgres(dsn) as make:
        figures["postgres_w1_us_per_step"] = (
            min(w1(W1_STEPS, store_factory=make) for _ in range(repeats)) / W1_STEPS * 1e6
        )
        figures["postgres_append_events_per_s"] = max(
            append_throughput(make, sessions, batches)[0] for _ in range(repeats)
        )
    figures["postgres_raw_events_per_s"] = max(
        raw_postgres_throughput(dsn, sessions, batches) for _ in range(repeats)
    )
    return figures


def rows(result: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Table rows: workload, ours, reference, ratio, target."""
    mem = result["memory_w1_us_per_step"]
    store_rate, encoded = (
        result["sqlite_append_events_per_s"],
        result["sqlite_raw_preencoded_events_per_s"],
    )
    out = [
        (
            "W1 µs/step: sqlite | memory",
            f"{result['sqlite_w1_us_per_step']:.0f}",
            f"{mem:.0f}",
            f"{result['sqlite_w1_ratio']:.2f}×",
            "≤ 2×",
        ),
        (
            "  floor: hop-memory W1 + commit",
            f"{result['sqlite_w1_floor_us_per_step']:.0f}",
            f"{mem:.0f}",
            f"{result['sqlite_w1_floor_us_per_step'] / mem:.2f}×",
            "",
        ),
        (
            "    W1, memory + empty hop | commit",
            f"{result['memory_hop_w1_us_per_step']:.0f}",
            f"{result['sqlite_raw_step_commit_us']:.0f}",
            "",
            "",
        ),
        (
            "append ev/s: store | sqlite3",
            f"{result['sqlite_append_events_per_s']:.0f}",
            f"{result['sqlite_raw_events_per_s']:.0f}",
            f"{result['sqlite_append_ratio']:.0%}",
            "≥ 50%",
        ),
        (
            "  sqlite3, rows pre-encoded",
            "",
            f"{encoded:.0f}",
            f"{store_rate / encoded:.0%}",
            "",
        ),
    ]
    if result.get("postgres_w1_us_per_step") is not None:
        pg_w1 = result["postgres_w1_us_per_step"]
        store, raw = result["postgres_append_events_per_s"], result["postgres_raw_events_per_s"]
        out.append(
            (
                "W1 µs/step: postgres | memory",
                f"{pg_w1:.0f}",
                f"{mem:.0f}",
                f"{pg_w1 / mem:.2f}×",
                "",
            )
        )
        out.append(
            ("append ev/s: store | psycopg", f"{store:.0f}", f"{raw:.0f}", f"{store / raw:.0%}", "")
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m dsh_agent_loop.bench.stores [--quick] [--json PATH]``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller append runs")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args(argv)
    result = run_store_bench(quick=args.quick)
    report("store benchmark (references measured in the same run)", rows(result), result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
