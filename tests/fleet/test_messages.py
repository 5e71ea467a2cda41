"""Messages across processes: ``send`` and ``run`` from this process, a worker in another.

docs/design.md#fleet-clients: a message reaches a session the worker has live or one it has to
activate (created by the fleet, or by a plain runtime that knows nothing of the fleet); a
repeated ``message_id`` is one message (one splice insert); ``run`` returns the claiming turn's
result, raises ``TurnFailedError`` for a failed turn and brings structured output back
structured.
"""

from __future__ import annotations

from functools import partial

import attrs
import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    Reply,
    ScriptedModel,
    TurnFailedError,
    open_runtime,
)
from dsh_agent_loop.stores import store_from_url

from .conftest import Fleet, check_log, inserted_ids, read_log, turn_ends, wait_log


def options(agent_id: str) -> AgentOptions:
    # one agent id per session: a runtime holds one live agent per id
    return AgentOptions(id=agent_id, provider="scripted", model="m")


async def test_send_to_owned_and_unowned_sessions(fleet: Fleet) -> None:
    # A session a plain runtime created: the fleet has no row for it until a send.
    async with open_runtime(
        store=store_from_url(fleet.url), providers={"scripted": ScriptedModel([Reply.text("x")])}
    ) as rt:
        plain = (await rt.agents.create("plain-1", options("plain"))).session_id
    worker = await fleet.start_worker("w1")
    async with fleet.client() as c:
        created = await c.create(options("made"), session_id="made-1")
        first = await c.run(created, "hello", timeout=60)
        assert first.text == "echo hello"
        await worker.wait_line(f"activated {created}")
        # now live on w1: a plain send is delivered without a new activation
        mid = await c.send(created, "again")
        events = await wait_log(
            c, created, lambda ev: len(turn_ends(ev)) >= 2, "the second turn", timeout=60
        )
        assert mid in inserted_ids(events)
        assert worker.count(f"activated {created}") == 1
        # the unowned session is activated on demand
        assert not worker.has(f"activated {plain}")
        result = await c.run(plain, "wake up", timeout=60)
        assert result.text == "echo wake up"
        assert worker.has(f"activated {plain}")
        for sid in (created, plain):
            check_log(await read_log(c, sid))


async def test_same_message_id_is_inserted_once(fleet: Fleet) -> None:
    worker = await fleet.start_worker("w1")
    async with fleet.client() as c, fleet.client() as other:
        sid = await c.create(options("a"))
        async with trio.open_nursery() as nursery:  # two clients race with one id
            for client in (c, other, c):
                nursery.start_soon(partial(client.send, sid, "once", message_id="m-same"))
        events = await wait_log(c, sid, lambda ev: len(turn_ends(ev)) >= 1, "the turn", timeout=60)
        # sent again after delivery: still the same message
        assert await other.send(sid, "once", message_id="m-same") == "m-same"
        result = await c.run(sid, "later", timeout=60)
        assert result.text == "echo later"
        events = await read_log(c, sid)
        assert inserted_ids(events).count("m-same") == 1
        check_log(events)
        status = await c.status()
        assert status.undelivered == 0
    assert worker.proc.returncode is None


@attrs.frozen
class Weather:
    city: str
    temp: int


async def test_run_across_processes(fleet: Fleet) -> None:
    await fleet.start_worker("w1")
    async with fleet.client() as c:
        sid = await c.create(options("a"))
        result = await c.run(sid, "ping", timeout=60)
        assert (result.text, result.kind) == ("echo ping", "completed")
        with pytest.raises(TurnFailedError) as failed:
            await c.run(sid, "fail now", timeout=60)
        assert failed.value.code == "AUTH"
        assert failed.value.result is not None
        assert failed.value.result.kind == "error"
        structured = await c.run(
            sid, 'json {"city": "Paris", "temp": 21}', output_type=Weather, timeout=60
        )
        assert structured.output == Weather("Paris", 21)
        check_log(await read_log(c, sid))
