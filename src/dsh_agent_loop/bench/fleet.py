"""The fleet benchmark: send→delivered latency, and end-to-end turns/s on 1 and 2 workers.

Run ``python -m dsh_agent_loop.bench.fleet [--quick] [--json PATH]`` (``scripts/bench/fleet.py``
wraps it); ``dsh-agent bench`` runs it too. See docs/design.md#fleet-workers.

Workers are real processes (``python -m dsh_agent_loop.bench.fleet --worker URL``): each opens
a runtime with ``fleet=FleetOptions()`` (default settings) and a scripted model that answers
every prompt with one short text, and serves until ``SIGTERM``. This process is the client.

- **Latency** (one worker): one session is created and warmed with a first turn; then each
  sample is one ``send`` and the time until the ``agent/inbox/spliced`` event inserting that message
  id is committed in the session's log (the log read every ``READ_POLL_S``), then the turn is
  let end before the next send. The agent stays live (its idle unload is far away), so this is
  delivery to a live agent: the worker's wake-up (a ``NOTIFY`` on PostgreSQL, its poll interval
  on SQLite), its read of the work, the inbox and the flush.
- **Throughput**: ``sessions`` sessions are created, each sent ``turns`` prompts at once (one
  ``send_many``, so the workers, not one client's round trips, set the pace); the
  time runs from the first send until every session's log holds its ``turns`` ``turn/end``
  events (the logs swept every ``SWEEP_S``). Measured with 1, then 2 worker processes.

On SQLite the file lives in a temporary directory; PostgreSQL is measured when
``$DSH_BENCH_POSTGRES_DSN`` (else ``$DSH_TEST_POSTGRES_DSN``) is set, on fresh tables dropped
after. No targets: the figures are reported (docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import trio

from dsh_agent_loop import (
    AgentOptions,
    FleetOptions,
    SessionNotFoundError,
    open_client,
    open_runtime,
)
from dsh_agent_loop.events import INBOX_SPLICED, TURN_END
from dsh_agent_loop.llm import Reply, ScriptedModel
from dsh_agent_loop.stores import store_from_url

__all__ = ["measure_latency", "measure_turns", "run_fleet_bench"]

#: What a worker child runs (``python -m``).
MODULE: Final = "dsh_agent_loop.bench.fleet"
#: Seconds between reads of the log while waiting for a splice.
READ_POLL_S: Final = 0.001
#: Seconds between sweeps of every session's log while waiting for the turns.
SWEEP_S: Final = 0.05
#: Environment variables naming a PostgreSQL DSN, in order.
PG_ENVS: Final = ("DSH_BENCH_POSTGRES_DSN", "DSH_TEST_POSTGRES_DSN")
#: Seconds a measurement may take before it is abandoned.
LIMIT_S: Final = 300.0


def _agent(n: int) -> AgentOptions:
    return AgentOptions(id=f"bench-{n}", provider="bench", model="bench")


# -- the worker child ---------------------------------------------------------------------------


async def _serve(url: str) -> None:
    model = ScriptedModel([Reply.text("done")], loop=True, record=False)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_runtime(
            store=store_from_url(url), providers={"bench": model}, fleet=FleetOptions()
        ):
            print("ready", flush=True)
            async for _ in signals:
                break


@contextmanager
def _workers(url: str, count: int) -> Iterator[None]:
    """``count`` worker processes on ``url``, each ready when this yields; stopped after."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", MODULE, "--worker", url],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a fleet worker did not start (exit {proc.wait()})")
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


# -- the measurements ---------------------------------------------------------------------------


async def _turn_ends(client: Any, sid: str) -> int:
    """``turn/end`` events in ``sid``'s log (0 while its worker has not created it)."""
    try:
        handle = await client.store.open(sid, "read")
    except SessionNotFoundError:
        return 0
    try:
        return sum(1 for event in await handle.read() if event.type == TURN_END)
    finally:
        await handle.close()


async def _wait_turns(client: Any, sid: str, turns: int) -> None:
    while await _turn_ends(client, sid) < turns:
        await trio.sleep(READ_POLL_S)


async def _latencies(url: str, samples: int) -> list[float]:
    async with open_client(url) as client:
        sid = await client.create(_agent(0))
        await client.send(sid, "warm up")
        await _wait_turns(client, sid, 1)
        seen = 0
        out: list[float] = []
        for i in range(samples):
            started = time.perf_counter()
            mid = await client.send(sid, f"prompt {i}")
            async with client.events(sid, after_seq=seen, poll_interval=READ_POLL_S) as events:
                async for event in events:
                    seen = event.seq if event.seq is not None else seen
                    spliced = event.type == INBOX_SPLICED
                    inserted = event.data.get("inserted", ()) if spliced else ()
                    if any(message.get("id") == mid for message in inserted):
                        break
            out.append(time.perf_counter() - started)
            await _wait_turns(client, sid, i + 2)
        return out


def measure_latency(url: str, samples: int) -> dict[str, float]:
    """send→splice-committed latency on ``url`` with one worker: p50, p99 (ms), samples."""
    with _workers(url, 1):
        seconds = sorted(trio.run(_latencies, url, samples))
    return {
        "p50_ms": _at(seconds, 0.50) * 1000,
        "p99_ms": _at(seconds, 0.99) * 1000,
        "samples": float(len(seconds)),
    }


def _at(ordered: Sequence[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


async def _throughput(url: str, sessions: int, turns: int) -> float:
    async with open_client(url) as client:
        sids = await client.create_many([_agent(n) for n in range(sessions)])
        started = time.perf_counter()
        # every prompt in one transaction: the figure is the workers', not one client's sends
        await client.send_many([(sid, f"turn {turn}") for turn in range(turns) for sid in sids])
        pending = list(sids)
        with trio.fail_after(LIMIT_S):
            while pending:
                pending = [sid for sid in pending if await _turn_ends(client, sid) < turns]
                if pending:
                    await trio.sleep(SWEEP_S)
        return sessions * turns / (time.perf_counter() - started)


def measure_turns(url: str, workers: int, sessions: int, turns: int) -> float:
    """End-to-end turns/s on ``url`` with ``workers`` worker processes."""
    with _workers(url, workers):
        return trio.run(_throughput, url, sessions, turns)


# -- the run ------------------------------------------------------------------------------------


def _figures(urls: Iterator[str], quick: bool) -> dict[str, float]:
    samples, sessions, turns = (20, 20, 2) if quick else (200, 200, 5)
    figures = {f"latency_{k}": v for k, v in measure_latency(next(urls), samples).items()}
    figures["turns_per_s_1"] = measure_turns(next(urls), 1, sessions, turns)
    figures["turns_per_s_2"] = measure_turns(next(urls), 2, sessions, turns)
    figures["turns"] = float(sessions * turns)
    return figures


def _sqlite_urls(tmp: str) -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"sqlite:///{Path(tmp) / f'fleet-{n}.db'}"


@contextmanager
def _postgres_urls(dsn: str) -> Iterator[Iterator[str]]:
    import psycopg

    prefixes: list[str] = []

    def urls() -> Iterator[str]:
        while True:
            prefix = f"bench_{secrets.token_hex(4)}_"
            prefixes.append(prefix)
            yield f"{dsn}{'&' if '?' in dsn else '?'}table_prefix={prefix}"

    try:
        yield urls()
    finally:
        tables = ("events", "sessions", "leases", "fleet_workers", "fleet_sessions")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for prefix in prefixes:
                for table in (*tables, "fleet_messages", "fleet_commands"):
                    conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")


def run_fleet_bench(quick: bool = False) -> dict[str, Any]:
    """Run the fleet benchmark; returns the JSON record (``postgres`` None without a DSN)."""
    result: dict[str, Any] = {"sqlite": None, "postgres": None}
    with tempfile.TemporaryDirectory(prefix="dsh-bench-fleet-") as tmp:
        result["sqlite"] = _figures(_sqlite_urls(tmp), quick)
    dsn = next((os.environ[name] for name in PG_ENVS if os.environ.get(name)), None)
    if dsn:
        with _postgres_urls(dsn) as urls:
            result["postgres"] = _figures(urls, quick)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m " + MODULE, description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--json", metavar="PATH", help="also write the record as JSON")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)  # a child's own
    args = parser.parse_args(argv)
    if args.worker is not None:
        trio.run(_serve, args.worker)
        return 0
    result = run_fleet_bench(args.quick)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
