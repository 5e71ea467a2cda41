"""A real HTTP/1.1 server on loopback for adapter tests (trio + h11), and test helpers.

Each request gets the next queued ``Reply`` (or the default one): a status, headers and body
pieces, each sent as one HTTP chunk, with optional delays and faults — close the connection
mid-body, reset it (RST), or stop sending and hang. Keep-alive works, so tests can count the
TCP connections a client opened.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import h11
import trio

from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.llm._assemble import Assembler
from dsh_agent_loop.llm._base import Chunk, ModelRequest, PreparedCall

TRANSCRIPTS = Path(__file__).parent / "transcripts"
SSE_HEADERS = (("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"))


def transcript(name: str) -> bytes:
    """The bytes of ``transcripts/NAME.sse``."""
    return (TRANSCRIPTS / f"{name}.sse").read_bytes()


def split_every(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes (the last may be shorter)."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


@attrs.define
class Reply:
    """One scripted response."""

    pieces: list[bytes] = attrs.field(factory=list)
    status: int = 200
    headers: tuple[tuple[str, str], ...] = SSE_HEADERS
    delay: float = 0.0
    """Seconds before the response head."""
    piece_delay: float = 0.0
    """Seconds after each piece."""
    cut_after: int | None = None
    """Close (FIN) after this many pieces, leaving the body unfinished."""
    reset_after: int | None = None
    """Reset (RST) after this many pieces."""
    hang_after: int | None = None
    """Send nothing more after this many pieces, until the client closes the connection."""
    reset_before_head: bool = False
    """Reset (RST) the connection instead of answering."""

    @classmethod
    def sse(cls, data: bytes, *, piece: int = 0, **kwargs: Any) -> Reply:
        """An event-stream reply with ``data`` split in ``piece``-byte pieces (0: one piece)."""
        return cls(pieces=split_every(data, piece) if piece else [data], **kwargs)

    @classmethod
    def error(cls, status: int, body: Any, *, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
        """A JSON (or text) error reply."""
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        ctype = "text/plain" if isinstance(body, str) else "application/json"
        return cls(pieces=[raw], status=status, headers=(("content-type", ctype), *headers))


@attrs.define
class Recorded:
    """One request the server received."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


@attrs.define
class LoopbackServer:
    """Replies in order, then ``default``; records requests and counts connections."""

    port: int = 0
    default: Reply | None = None
    gate: Callable[[Recorded], Reply | None] | None = None
    """Sees each request first; a reply it returns (an API's refusal) is served instead of
    the next queued one, which then waits for the next request."""
    queue: list[Reply] = attrs.field(factory=list)
    requests: list[Recorded] = attrs.field(factory=list)
    connections: int = 0
    """TCP connections accepted."""
    hung_up: int = 0
    """Hanging replies whose client closed the connection."""

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def push(self, *replies: Reply) -> None:
        """Queue replies for the next requests."""
        self.queue.extend(replies)

    def _next(self) -> Reply:
        if self.queue:
            return self.queue.pop(0)
        assert self.default is not None, "the test server has no reply left"
        return self.default

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one connection until the client closes it or a fault ends it."""
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while await self._cycle(conn, stream):
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass  # the client went away
        finally:
            await stream.aclose()

    async def _cycle(self, conn: h11.Connection, stream: trio.SocketStream) -> bool:
        request = await self._read(conn, stream)
        if request is None:
            return False
        self.requests.append(request)
        refusal = self.gate(request) if self.gate is not None else None
        reply = refusal if refusal is not None else self._next()
        if reply.delay:
            await trio.sleep(reply.delay)
        if reply.reset_before_head:
            _reset(stream)
            return False
        headers = [(k.encode(), v.encode()) for k, v in reply.headers]
        await self._send(conn, stream, h11.Response(status_code=reply.status, headers=headers))
        for i, piece in enumerate([*reply.pieces, None]):
            if i == reply.cut_after:
                return False  # FIN without the terminating chunk
            if i == reply.reset_after:
                _reset(stream)
                return False
            if i == reply.hang_after:
                try:
                    while await stream.receive_some(65536):
                        pass  # the client closing is what ends a hang
                except trio.BrokenResourceError:
                    pass
                self.hung_up += 1
                return False
            if piece is None:
                break
            if piece:
                await self._send(conn, stream, h11.Data(data=piece))
            if reply.piece_delay:
                await trio.sleep(reply.piece_delay)
        await self._send(conn, stream, h11.EndOfMessage())
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    @staticmethod
    async def _send(conn: h11.Connection, stream: trio.SocketStream, event: Any) -> None:
        data = conn.send(event)
        if data:
            await stream.send_all(data)

    @staticmethod
    async def _read(conn: h11.Connection, stream: trio.SocketStream) -> Recorded | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                headers = {k.decode().lower(): v.decode() for k, v in head.headers}
                return Recorded(head.method.decode(), head.target.decode(), headers, bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None


def _reset(stream: trio.SocketStream) -> None:
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


@asynccontextmanager
async def open_loopback_server(default: Reply | None = None) -> AsyncIterator[LoopbackServer]:
    """Serve on ``127.0.0.1`` (an ephemeral port) for the duration of the block."""
    server = LoopbackServer(default=default)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    server.port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, server.handle, listeners)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


def refused_url() -> str:
    """A loopback URL where nothing listens (connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


USER_HI = (FrozenDict(role="user", id="m-1", content=(FrozenDict(type="text", text="hi"),)),)


@asynccontextmanager
async def closing(adapter: Any) -> AsyncIterator[Any]:
    """Close ``adapter`` (its pooled client) when the block ends."""
    try:
        yield adapter
    finally:
        await adapter.aclose()


async def collect(
    adapter: Any, config: Mapping[str, Any], messages: Any = USER_HI, tools: Any = ()
) -> list[Chunk]:
    """Prepare ``config`` on ``adapter`` and stream one attempt to the end."""
    prepared = await adapter.prepare_call(config)
    return await collect_prepared(prepared, messages, tools)


async def collect_prepared(
    prepared: PreparedCall, messages: Any = USER_HI, tools: Any = ()
) -> list[Chunk]:
    """Stream one attempt of a prepared call to the end."""
    request = ModelRequest(prepared.config, messages, tools)
    async with aclosing(prepared.stream(request)) as stream:  # type: ignore[type-var]
        return [chunk async for chunk in stream]


def assemble(chunks: list[Chunk]) -> tuple[Any, ...]:
    """The assistant content blocks the driver would store for ``chunks``."""
    assembler = Assembler()
    for chunk in chunks:
        assembler.feed(chunk)
    return assembler.content()
