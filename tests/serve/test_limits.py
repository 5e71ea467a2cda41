"""The server's own limits, in process: event streams open at once, request bodies, and how
long a command waits for a worker.

``serve`` runs in the test's trio run on a real loopback port (the same app ``dsh-agent serve``
runs), with no worker: a session queued for creation is enough to stream (it has no event yet).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing

from dsh_agent_loop import (
    AgentOptions,
    FleetOptions,
    Reply,
    ScriptedModel,
    SqliteStore,
    open_client,
    open_runtime,
    tool,
)
from dsh_agent_loop.serve import serve

AGENT = AgentOptions(id="a", provider="scripted", model="m")


@asynccontextmanager
async def running(tmp_path: Path, **options: object) -> AsyncIterator[tuple[str, str]]:
    """A server on a fresh SQLite store: its address, and one queued session's id."""
    async with SqliteStore(tmp_path / "s.db") as store, open_client(store) as client:
        sid = await client.create(AGENT)
        async with trio.open_nursery() as nursery:
            address = await nursery.start(partial(serve, store, agents=[AGENT], port=0, **options))
            yield address, sid
            nursery.cancel_scope.cancel()


async def open_stream(address: str, path: str) -> tuple[trio.SocketStream, bytes]:
    """A raw HTTP/1.1 GET of ``path``; the connection and what arrived first."""
    host, _, port = address.removeprefix("http://").rpartition(":")
    conn = await trio.open_tcp_stream(host, int(port))
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n"
    await conn.send_all(request.encode())
    received = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in received or received.endswith(b"\r\n\r\n"):
            chunk = await conn.receive_some()
            assert chunk, f"the server closed the connection; got {received!r}"
            received += chunk
    return conn, received


def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
    with httpx.Client(timeout=10) as http:
        return http.request(method, url, **kwargs)


async def test_streams_over_the_limit_are_refused_until_one_closes(tmp_path: Path) -> None:
    async with running(tmp_path, max_streams=2) as (address, sid):
        path = f"/api/sessions/{sid}/stream"
        one, first = await open_stream(address, path)
        two, second = await open_stream(address, path)
        for head in (first, second):  # both running: the first SSE comment arrived
            assert head.startswith(b"HTTP/1.1 200"), head
            assert b"stream of committed events" in head
        third = await trio.to_thread.run_sync(call, "GET", address + path)
        assert third.status_code == 503
        assert third.json()["error"]["code"] == "TOO_MANY_STREAMS"
        await one.aclose()
        await two.aclose()
        # Both closed: the server sees the disconnects and admits a new stream.
        with trio.fail_after(10):
            while True:
                again, head = await open_stream(address, path)
                await again.aclose()
                if head.startswith(b"HTTP/1.1 200"):
                    break
                await trio.sleep(0.05)


async def test_a_body_over_the_limit_is_413_and_nothing_is_sent(tmp_path: Path) -> None:
    async with running(tmp_path) as (address, sid):
        url = f"{address}/api/sessions/{sid}/messages"
        reply = await trio.to_thread.run_sync(
            partial(call, "POST", url, json={"text": "y" * 1_100_000})
        )  # under the body limit, over a message's
        assert reply.status_code == 413
        assert reply.json()["error"]["code"] == "LIMIT_EXCEEDED"
        huge = json.dumps({"text": "x" * 2_100_000}).encode()
        conn, head = await post_raw(address, f"/api/sessions/{sid}/messages", huge)
        await conn.aclose()
        assert head.startswith(b"HTTP/1.1 413"), head
        status = await trio.to_thread.run_sync(call, "GET", f"{address}/api/fleet")
        assert status.json()["undelivered"] == 0


async def post_raw(address: str, path: str, body: bytes) -> tuple[trio.SocketStream, bytes]:
    """POST ``body`` declaring its length; the reply's head, read before the body is all sent."""
    host, _, port = address.removeprefix("http://").rpartition(":")
    conn = await trio.open_tcp_stream(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    await conn.send_all(head.encode() + body[:1000])  # the server answers from the length alone
    received = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in received:
            chunk = await conn.receive_some()
            assert chunk, f"the server closed the connection; got {received!r}"
            received += chunk
    return conn, received


async def texts(store: SqliteStore, sid: str) -> list[str]:
    """The text blocks of the session's assistant messages."""
    reader = await store.open(sid, "read")
    try:
        events = await reader.read()
    finally:
        await reader.close()
    return [
        block.get("text")
        for event in events
        if event.type == "assistant/message"
        for block in event.data["message"]["content"]
    ]


async def look(path: str) -> str:
    """Look at a path."""
    return f"saw {path}"


async def test_a_command_no_worker_applies_in_time_is_202_and_stays_queued(tmp_path: Path) -> None:
    guarded = AgentOptions(id="g", provider="scripted", model="m", require_approval=["look"])
    model = ScriptedModel([Reply.tool_calls(("look", {"path": "a"}, "c1")), Reply.text("looked")])
    worker = partial(
        open_runtime,
        store=SqliteStore(tmp_path / "s.db"),
        providers={"scripted": model},
        tools=[tool(look)],
        fleet=FleetOptions(idle_unload_s=60.0),
    )
    async with SqliteStore(tmp_path / "s.db") as store, open_client(store) as client:
        sid = await client.create(guarded)
        async with worker():  # a worker runs the turn until it waits for approval, then stops
            first = await client.run(sid, "look at a", timeout=30)
        assert first.reason["kind"] == "awaiting-approval"
        async with trio.open_nursery() as nursery:
            address = await nursery.start(
                partial(serve, store, agents=[guarded], port=0, command_wait=0.2)
            )
            url = f"{address}/api/sessions/{sid}/approvals/c1"
            reply = await trio.to_thread.run_sync(
                partial(call, "POST", url, json={"decision": "approve"})
            )
            assert (reply.status_code, reply.json()) == (202, {"applied": False})
            async with worker():  # the next worker applies the queued decision
                with trio.fail_after(30):
                    while "looked" not in await texts(store, sid):
                        await trio.sleep(0.05)
            nursery.cancel_scope.cancel()


async def test_a_body_slower_than_its_time_limit_is_408(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (address, sid):
        host, _, port = address.removeprefix("http://").rpartition(":")
        conn = await trio.open_tcp_stream(host, int(port))
        head = (
            f"POST /api/sessions/{sid}/messages HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        await conn.send_all(head.encode() + b'{"text": "sl')  # and then nothing more
        started = trio.current_time()
        received = b""
        with trio.fail_after(120):
            while b"REQUEST_TIMEOUT" not in received:
                chunk = await conn.receive_some()
                assert chunk, f"closed without the coded reply; got {received!r}"
                received += chunk
        await conn.aclose()
        assert received.startswith(b"HTTP/1.1 408"), received
        assert trio.current_time() - started >= 30
