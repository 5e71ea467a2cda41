"""``kill -9`` at random moments, then resume: nothing acknowledged is lost
(docs/reliability.md#crash-tests).

A child process (``child.py``) runs one agent on one session, turn after turn, and prints every
seq it saw acknowledged as durable. The parent kills it with SIGKILL after a seeded random
delay, then, in-process, with fresh store objects:

1. reads the stored log: seqs dense from 0, every acknowledged seq stored with the type the
   child reported (``lost acks``);
2. checks the side-effect file: every call id a tool recorded has a stored ``tool/call``
   (a side effect exists only if its call was durable first);
3. resumes the session: the repaired log passes ``invariants.check``; each repair result is
   ``TOOL_OUTCOME_UNKNOWN`` when its ``tool/call`` was stored (and every stored call whose
   tool ran but has no stored result gets one), ``TOOL_NOT_STARTED`` with a synthetic call
   otherwise (and then the tool never ran);
4. runs one more turn on the resumed agent, which must complete.

Several kills reuse one session, so repair also runs over logs that earlier repairs closed.
CI runs 30 SQLite + 20 PostgreSQL kills (PostgreSQL needs ``DSH_TEST_POSTGRES_DSN``);
``DSH_LONG=1`` runs 300 + 200. A broken child that acknowledges before commit and runs tools
without the flush barrier must be caught.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    Event,
    ModelRequest,
    Reply,
    ScriptedModel,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    invariants,
    open_runtime,
    tool,
)
from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop.stores import SqliteStore

from ..stores.conftest import drop_pg_tables, new_pg_prefix, postgres_dsn

LONG = os.environ.get("DSH_LONG") == "1"
CHILD = Path(__file__).with_name("child.py")
OPTIONS = AgentOptions(id="crash", provider="s", model="m")
#: Kills per session before the next session starts.
KILLS_PER_SESSION = 5
#: Children run side by side (each on its own session) to keep the wall time down.
LANES = 3
PG_TTL = 0.5


@attrs.define
class Tally:
    """What the kill runs found (printed as the summary line)."""

    kills: int = 0
    acks: int = 0
    lost_acks: int = 0
    violations: int = 0
    orphan_effects: int = 0
    stopped: int = 0
    """Children whose agent a store failure stopped before the kill (PostgreSQL: a stall
    longer than the lease lets it expire; the next owner then takes over as designed)."""
    outcomes: Counter[str] = attrs.Factory(Counter)
    problems: list[str] = attrs.Factory(list)

    def problem(self, kill: int, text: str) -> None:
        self.problems.append(f"kill {kill}: {text}")

    def summary(self, backend: str) -> str:
        return (
            f"crash[{backend}]: kills={self.kills} acks={self.acks} lost_acks={self.lost_acks} "
            f"violations={self.violations} side_effects_without_durable_call="
            f"{self.orphan_effects} repairs={dict(self.outcomes)} stopped={self.stopped}"
        )


@attrs.define
class Backend:
    """How to reach one backend's location, from the child and in-process."""

    name: str
    location: str
    options: list[str]
    """Extra child options (``--prefix``, ``--ttl``)."""
    make_store: Callable[[], SessionStore]


# --- the child ------------------------------------------------------------------------------------


async def run_child(
    tally: Tally, backend: Backend, sid: str, effects: Path, seed: int, delay: float, broken: bool
) -> dict[int, str]:
    """Start a child, kill it ``delay`` seconds after READY; return the acks it printed."""
    args = [sys.executable, str(CHILD), backend.name, backend.location, sid, str(effects)]
    args += [*backend.options, "--seed", str(seed)]
    if broken:
        args.append("--broken")
    proc = await trio.lowlevel.open_process(args, stdout=-1)  # subprocess.PIPE
    assert proc.stdout is not None
    out = bytearray()
    try:
        with trio.fail_after(60):
            while b"READY\n" not in out:
                chunk = await proc.stdout.receive_some()
                if not chunk:
                    raise AssertionError(f"child exited before READY ({await proc.wait()})")
                out += chunk
        with trio.move_on_after(delay):
            while chunk := await proc.stdout.receive_some():
                out += chunk
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await proc.wait()  # reaped: the owner's pid is dead for the takeover check
            while chunk := await proc.stdout.receive_some():  # what it printed before dying
                out += chunk
            await proc.stdout.aclose()
    assert proc.returncode == -signal.SIGKILL, f"child ended by itself: {proc.returncode}"
    acks: dict[int, str] = {}
    if b"\nSTOPPED " in out:
        tally.stopped += 1
    for line in out.decode().splitlines():
        if line.startswith("ACK ") and len(parts := line.split()) == 3:
            seq, type_ = int(parts[1]), parts[2]
            assert acks.setdefault(seq, type_) == type_, f"seq {seq} acked as two types"
    return acks


# --- the checks -------------------------------------------------------------------------------


def effects_of(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def check_stored(tally: Tally, kill: int, stored: list[Event], acks: dict[int, str]) -> None:
    if [e.seq for e in stored] != list(range(len(stored))):
        tally.violations += 1
        tally.problem(kill, "stored seqs are not dense from 0")
    tally.acks += len(acks)
    for seq, type_ in sorted(acks.items()):
        if seq >= len(stored) or stored[seq].type != type_:
            tally.lost_acks += 1
            tally.problem(kill, f"acknowledged seq {seq} ({type_}) is not stored")


def check_effects(tally: Tally, kill: int, stored: list[Event], effects: list[str]) -> None:
    calls = {e.data["call_id"] for e in stored if e.type == "tool/call"}
    for call_id in effects:
        if call_id not in calls:
            tally.orphan_effects += 1
            tally.problem(kill, f"side effect of {call_id} without a durable tool/call")


def check_repair(
    tally: Tally, kill: int, stored: list[Event], resumed: list[Event], effects: list[str]
) -> None:
    violations = invariants.check(resumed, allow_open_turn=False)
    tally.violations += len(violations)
    for v in violations:
        tally.problem(kill, f"after repair: {v}")
    closers = resumed[len(stored) :]
    if resumed[: len(stored)] != stored:
        tally.violations += 1
        tally.problem(kill, "resume changed stored events")
    stored_calls = {e.data["call_id"]: e.seq for e in stored if e.type == "tool/call"}
    answered = {e.data["message"]["call_id"] for e in stored if e.type == "tool/result"}
    repaired: dict[str, str] = {}
    for event in closers:
        if event.type != "tool/result":
            continue
        call_id = event.data["message"]["call_id"]
        code = event.data["error"]["code"]
        repaired[call_id] = code
        tally.outcomes[code] += 1
        cited = event.source_event_seqs[0] if event.source_event_seqs else None
        if code == "TOOL_OUTCOME_UNKNOWN":
            ok = cited == stored_calls.get(call_id)
        elif code == "TOOL_NOT_STARTED":
            ok = call_id not in stored_calls and call_id not in effects and cited is not None
            ok = ok and cited >= len(stored) and resumed[cited].type == "tool/call"
        else:
            ok = False
        if not ok:
            tally.violations += 1
            tally.problem(kill, f"repair of {call_id}: {code} citing {cited} is wrong")
    for call_id in set(effects) & set(stored_calls) - answered:
        if repaired.get(call_id) != "TOOL_OUTCOME_UNKNOWN":
            tally.violations += 1
            tally.problem(kill, f"{call_id} ran, has no result, and was not marked unknown")


async def resume_and_continue(
    tally: Tally, kill: int, store: SessionStore, sid: str, stored: list[Event], effects: Path
) -> None:
    """Resume in-process, check the repair, and run one more turn that uses a tool."""

    @tool
    async def work(n: int) -> str:
        """Do a unit of work."""
        return f"work {n} done (parent)"

    calls = itertools.count()

    def reply(request: ModelRequest) -> Reply:
        if request.messages[-1]["role"] == "tool":
            return Reply.text("resumed fine")
        return Reply.tool_calls(("work", {"n": -1}, f"parent-{kill}-{next(calls)}"))

    # (work queued before the crash resumes first, as its own turn: every turn gets replies)
    model = ScriptedModel([reply], loop=True)
    async with open_runtime(store=store, providers={"s": model}, tools=[work]) as rt:
        handle = await rt.agents.resume(sid, options=OPTIONS)
        agent = handle.agent
        check_repair(tally, kill, stored, list(agent.session.events), effects_of(effects))
        agent.followup("are you still there?")
        with trio.fail_after(30):
            await agent.wait_idle()
        events = list(agent.session.events)
        ends = [e.data["reason"] for e in events if e.type == "turn/end"]
        if ends[-1]["kind"] != "completed" or invariants.check(events, allow_open_turn=False):
            tally.violations += 1
            tally.problem(kill, f"the turn after resume ended {dict(ends[-1])}")


async def stored_log(store: SessionStore, sid: str) -> list[Event]:
    """The final stored log of a killed owner's session.

    Read under write ownership: taking it waits out the dead owner (its PostgreSQL lease, and
    a COMMIT its server session may still be finishing), so nothing lands after the read.
    """
    with trio.fail_after(30):
        while True:
            try:
                handle = await store.open(sid, "write")
                break
            except SessionNotFoundError:
                return []  # killed before its first flush: nothing stored, no trace
            except SessionAlreadyOwnedError:
                await trio.sleep(0.05)
    try:
        return list(await handle.read())
    finally:
        await handle.abort()  # nothing staged: only gives the ownership back


async def kill_lane(
    tally: Tally,
    backend: Backend,
    tmp: Path,
    lane: int,
    kills: int,
    rng: random.Random,
    broken: bool,
) -> None:
    for k in range(kills):
        kill = lane * 10_000 + k
        sid = f"crash-{lane}-{k // KILLS_PER_SESSION}"
        effects = tmp / f"{sid}.effects"
        delay = rng.choice([0.0, rng.uniform(0.0, 0.05), rng.uniform(0.05, 0.5)])
        acks = await run_child(tally, backend, sid, effects, rng.randrange(2**32), delay, broken)
        tally.kills += 1
        store = backend.make_store()
        try:
            stored = await stored_log(store, sid)
            check_stored(tally, kill, stored, acks)
            check_effects(tally, kill, stored, effects_of(effects))
            if stored:
                await resume_and_continue(tally, kill, store, sid, stored, effects)
        finally:
            await store.aclose()


async def kill_runs(backend: Backend, tmp: Path, kills: int, seed: int, broken: bool) -> Tally:
    tally = Tally()
    rngs = [random.Random(f"{seed}-{lane}") for lane in range(LANES)]
    share = [kills // LANES + (lane < kills % LANES) for lane in range(LANES)]
    async with trio.open_nursery() as nursery:
        for lane in range(LANES):
            nursery.start_soon(
                kill_lane, tally, backend, tmp, lane, share[lane], rngs[lane], broken
            )
    return tally


# --- the tests ------------------------------------------------------------------------------------


def sqlite_backend(tmp: Path) -> Backend:
    path = tmp / "sessions.db"
    return Backend("sqlite", str(path), [], lambda: SqliteStore(path))


def postgres_backend(prefix: str) -> Backend:
    from dsh_agent_loop.stores.postgres import PostgresStore

    dsn = postgres_dsn()
    options = ["--prefix", prefix, "--ttl", str(PG_TTL)]
    return Backend("postgres", dsn, options, lambda: PostgresStore(dsn, table_prefix=prefix))


def report(tally: Tally, backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n" + tally.summary(backend))
        for problem in tally.problems[:20]:
            print("  " + problem)


@pytest.mark.slow
async def test_kill_9_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tally = await kill_runs(sqlite_backend(tmp_path), tmp_path, 300 if LONG else 30, 1, False)
    report(tally, "sqlite", capsys)
    assert tally.kills >= (300 if LONG else 30)
    assert tally.acks > 0
    assert (tally.lost_acks, tally.violations, tally.orphan_effects) == (0, 0, 0), tally.problems
    assert tally.outcomes["TOOL_OUTCOME_UNKNOWN"] + tally.outcomes["TOOL_NOT_STARTED"] > 0


@pytest.mark.slow
async def test_kill_9_postgres(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = new_pg_prefix()
    backend = postgres_backend(prefix)
    try:
        tally = await kill_runs(backend, tmp_path, 200 if LONG else 20, 2, False)
    finally:
        await trio.to_thread.run_sync(drop_pg_tables, postgres_dsn(), prefix)
    report(tally, "postgres", capsys)
    assert tally.kills >= (200 if LONG else 20)
    assert tally.acks > 0
    assert (tally.lost_acks, tally.violations, tally.orphan_effects) == (0, 0, 0), tally.problems


@pytest.mark.slow
async def test_the_harness_catches_acknowledging_before_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tally = await kill_runs(sqlite_backend(tmp_path), tmp_path, 12, 3, True)
    report(tally, "sqlite, broken child", capsys)
    assert tally.lost_acks > 0
    assert tally.orphan_effects > 0
