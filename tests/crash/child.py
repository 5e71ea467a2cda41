"""The process the crash tests kill: one agent running scripted turns on one session, forever.

Usage::

    python child.py BACKEND LOCATION SESSION_ID EFFECTS_FILE [--prefix P] [--ttl T] [--seed S]
                    [--broken]

BACKEND is ``sqlite`` (LOCATION: the database file) or ``postgres`` (LOCATION: the DSN, with
``--prefix`` the table prefix and ``--ttl`` the lease). The child resumes SESSION_ID (crash
repair included) or creates it, prints ``READY``, then runs turns until it is killed: text
replies, single tool calls and batches of parallel (and some exclusive) tool calls, streamed
with a little latency.

It reports on stdout, one flushed line each, only what it knows to be durable:

- ``ACK <seq> <type>`` for every event the session writer published after its commit
  (``session/event``), for the ``tool/call`` of a running tool (a handler runs only after the
  flush that covers its call), and for the ``turn/end`` after ``wait_idle()`` (unless a store
  failure stopped the agent: then ``STOPPED <code>``, and it waits to be killed);
- the tool ``work`` appends its call id to EFFECTS_FILE (``fsync``'d) before it returns: that
  is its side effect, which must never exist without a durable ``tool/call``.

``--broken`` acknowledges before commit (each event as soon as it is appended) and runs tools
without the flush barrier — the variant the harness must catch.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
from typing import Any

import trio

from dsh_agent_loop import (
    AgentOptions,
    Event,
    ModelRequest,
    Reply,
    ScriptedModel,
    SessionAlreadyOwnedError,
    ToolContext,
    open_runtime,
    tool,
)
from dsh_agent_loop._agent._actor import AgentActor
from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop._session.writer import SessionWriter
from dsh_agent_loop.testing import actor_of

OPTIONS = AgentOptions(id="crash", provider="s", model="m")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def make_store(args: argparse.Namespace) -> SessionStore:
    if args.backend == "sqlite":
        from dsh_agent_loop.stores import SqliteStore

        return SqliteStore(args.location)
    from dsh_agent_loop.stores.postgres import PostgresStore

    return PostgresStore(args.location, table_prefix=args.prefix, lease_ttl=args.ttl)


def record_effect(path: str, call_id: str) -> None:
    """The tool's side effect: one line, on disk before the tool returns."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{call_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Script:
    """Replies cycling through text, single and parallel tool calls, with unique call ids."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ids = itertools.count()
        self.tag = f"p{os.getpid()}"

    def call(self) -> tuple[str, dict[str, Any], str]:
        n = next(self.ids)
        name = "solo" if self.rng.random() < 0.3 else "work"
        return (name, {"n": n}, f"{self.tag}-{n}")

    def __call__(self, request: ModelRequest) -> Reply:
        last = request.messages[-1]
        if last["role"] == "tool":  # after tools: sometimes more tools, mostly an answer
            if self.rng.random() < 0.3:
                return Reply.tool_calls(self.call())
            return Reply.text("done with the tools for now " * self.rng.randint(1, 3))
        kind = self.rng.random()
        if kind < 0.25:
            return Reply.text("a plain answer that streams word by word " * self.rng.randint(1, 4))
        if kind < 0.6:
            return Reply.tool_calls(self.call(), text="one tool")
        calls = [self.call() for _ in range(self.rng.randint(2, 4))]
        return Reply.tool_calls(*calls, text="several tools at once")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=["sqlite", "postgres"])
    parser.add_argument("location")
    parser.add_argument("session_id")
    parser.add_argument("effects")
    parser.add_argument("--prefix", default="dsh_")
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--broken", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    agent: Any = None

    async def run(n: int, ctx: ToolContext) -> str:
        """Do a unit of work with a side effect."""
        for event in reversed(agent.session.events):
            if event.type == "tool/call" and event.data["call_id"] == ctx.call_id:
                say(f"ACK {event.seq} tool/call")
                break
        record_effect(args.effects, ctx.call_id)
        await trio.sleep(rng.random() * 0.004)
        return f"work {n} done"

    work = tool(name="work")(run)
    # An exclusive call waits for the earlier ones: its tool/call is appended (and flushed)
    # later than the assistant message, so a kill can leave it unrecorded (TOOL_NOT_STARTED).
    solo = tool(name="solo", execution_mode="exclusive")(run)

    model = ScriptedModel([Script(rng)], loop=True, latency=0.0003)
    async with open_runtime(
        store=make_store(args), providers={"s": model}, tools=[work, solo]
    ) as rt:

        def acknowledge(note: Event) -> None:
            event = note.data["event"]
            say(f"ACK {event.seq} {event.type}")

        if not args.broken:
            rt.hooks.on("session/event", acknowledge)
        while True:  # a killed predecessor's PostgreSQL lease expires after its ttl
            try:
                handle = await rt.agents.resume(
                    args.session_id, options=OPTIONS, create_if_missing=True
                )
                break
            except SessionAlreadyOwnedError:
                await trio.sleep(0.05)
        agent = handle.agent
        if args.broken:  # acknowledge on append, before any commit; run tools before it too
            log = actor_of(agent).log

            async def no_barrier(self: object) -> None:
                await trio.lowlevel.checkpoint()

            # This process only: no flush waits for a commit, however the loop reaches it.
            AgentActor.flush = no_barrier  # type: ignore[method-assign]
            SessionWriter.flush = no_barrier  # type: ignore[method-assign]
            writer = log.waker
            assert writer is not None

            class AckOnAppend:
                def wake(self) -> None:
                    for event in log.pending_events():
                        say(f"ACK {event.seq} {event.type}")
                    writer.wake()

            log.waker = AckOnAppend()
        say("READY")
        for i in itertools.count():
            agent.followup(f"task {i}")
            await agent.wait_idle()
            if actor_of(agent).store_failure is not None:
                # The store stopped the agent (a stall longer than the PostgreSQL lease lets
                # the lease expire): its last turn/end is not durable. Wait to be killed.
                say(f"STOPPED {actor_of(agent).store_failure.code}")
                await trio.sleep_forever()
            ends = [e for e in agent.session.events if e.type == "turn/end"]
            say(f"ACK {ends[-1].seq} turn/end")


if __name__ == "__main__":
    trio.run(main)
