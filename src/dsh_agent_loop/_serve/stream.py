"""``GET /api/sessions/{id}/stream``: a session's committed events as Server-Sent Events.

Each event is one SSE record, ``id: <seq>``, ``event: event``, ``data: <event JSON>``, sent once
it is committed (the fleet client's tail reads the store; docs/design.md#serve). The stream
starts after ``after_seq`` (query), or after the ``Last-Event-ID`` header's seq, which wins: an
``EventSource`` that reconnects sends the id of the last record it received, so it misses
nothing and sees nothing twice. A comment line ``: keepalive`` goes out every ``KEEPALIVE``
seconds of quiet, so proxies and browsers keep the connection. The stream ends only when the
client goes away (Starlette cancels the generator then). Each open stream polls the store, so at
most ``ServeContext.max_streams`` are open at once; one more gets 503 ``TOO_MANY_STREAMS``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Final

import trio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..events import event_to_json
from .api import int_query, known_or_queued, state_of
from .replies import ApiError, bad

#: Seconds of quiet between keepalive comments.
KEEPALIVE: Final = 15.0
#: Seconds between looks at the store for new events.
POLL: Final = 0.1


def check_room(request: Request) -> None:
    """Refuse one more event stream (``/stream``, ``/agui``) when the server has its maximum.

    Raises:
        ApiError: 503 ``TOO_MANY_STREAMS``.
    """
    ctx, _ = state_of(request)
    if request.app.state.streams >= ctx.max_streams:
        raise ApiError(503, "TOO_MANY_STREAMS", f"{ctx.max_streams} event streams are open already")


async def counted(request: Request, records: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """``records``, counted among the open streams while it runs (one never started is not)."""
    state = request.app.state
    state.streams += 1
    try:
        async with aclosing(records):
            async for record in records:
                yield record
    finally:
        state.streams -= 1


def _start(request: Request) -> int:
    """The seq the stream starts after."""
    after = int_query(request, "after_seq", -1, -1, 2**62)
    last = request.headers.get("last-event-id")
    if last is not None and last.strip():
        try:
            after = int(last.strip())
        except ValueError:
            raise bad("header 'Last-Event-ID' must be an event seq") from None
        if after < -1:
            raise bad("header 'Last-Event-ID' must be an event seq")
    return after


async def session_stream(request: Request) -> Response:
    """Stream the session's events (module docstring)."""
    ctx, _ = state_of(request)
    sid = request.path_params["sid"]
    after = _start(request)
    await known_or_queued(ctx, sid)
    check_room(request)

    async def records() -> AsyncGenerator[str, None]:
        tail = ctx.client.events(sid, after_seq=after, poll_interval=POLL)
        yield ": stream of committed events\n\n"
        while True:
            with trio.move_on_after(KEEPALIVE) as quiet:
                event = await tail.__anext__()
            if quiet.cancelled_caught:
                yield ": keepalive\n\n"
                continue
            yield f"id: {event.seq}\nevent: event\ndata: {event_to_json(event)}\n\n"

    headers = {"cache-control": "no-store", "x-accel-buffering": "no"}
    return StreamingResponse(
        counted(request, records()), media_type="text/event-stream", headers=headers
    )
