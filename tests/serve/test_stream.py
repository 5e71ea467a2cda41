"""A session's Server-Sent Events stream, from outside, over SQLite and PostgreSQL.

``GET /api/sessions/{id}/stream`` sends every committed event after a point, then each new one
as it commits, framed ``id: <seq>``, ``event: event``, ``data: <event JSON>``
(docs/design.md#serve). A client that loses the connection and comes back with the last seq it
saw (``Last-Event-ID``, as a browser's ``EventSource`` does) must get every later event exactly
once, in order: the union of what it read is the log.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from .api_helpers import (
    Api,
    Frame,
    ended_turns,
    frames_where,
    has_seq,
    open_stream,
    seqs,
)


async def session_after_turns(api: Api, agent: str, *messages: str) -> str:
    """A new session of ``agent`` that ran one turn per message."""
    sid = await api.create(agent, prompt=messages[0], session_id=f"sse-{secrets.token_hex(4)}")
    await api.wait_events(sid, ended_turns(1), "turn 1")
    for count, text in enumerate(messages[1:], start=2):
        await api.post(f"/api/sessions/{sid}/messages", {"text": text})
        await api.wait_events(sid, ended_turns(count), f"turn {count}")
    return sid


def turn_ended(turn: int) -> Any:
    return frames_where(lambda e: e["type"] == "turn/end" and e["data"]["turn"] == turn)


def check_framing(frame: Frame) -> dict[str, Any]:
    """The frame is exactly ``id``, ``event: event`` and one ``data`` line; its event."""
    lines = frame.raw.split("\n")
    assert len(lines) == 3, frame.raw
    assert lines[0] == f"id: {frame.seq}"
    assert lines[1] == "event: event"
    assert lines[2].startswith("data: {")
    event: dict[str, Any] = json.loads(lines[2].removeprefix("data: "))
    assert event["seq"] == frame.seq
    return event


async def test_backlog_then_live_events(api: Api) -> None:
    sid = await session_after_turns(api, "talker", "first")
    backlog = await api.events(sid)
    async with open_stream(api, sid) as (response, stream):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = await stream.until(has_seq(backlog[-1]["seq"]), "the stored events")
        assert [check_framing(f) for f in frames] == backlog
        # A message sent while the stream is open arrives live, turn and all.
        sent = await api.post(f"/api/sessions/{sid}/messages", {"text": "live one"})
        frames = await stream.until(turn_ended(2), "the live turn")
    events = [check_framing(f) for f in frames]
    assert seqs(frames) == list(range(len(frames)))
    assert events == (await api.events(sid))[: len(frames)]
    live = events[len(backlog) :]
    assert any(
        m["id"] == sent["message_id"]
        for e in live
        if e["type"] == "agent/inbox/spliced"
        for m in e["data"].get("inserted", ())
    )
    assert "live one" in json.dumps([e for e in live if e["type"] == "user/message"])


async def test_reconnect_with_last_event_id_misses_nothing(api: Api) -> None:
    sid = await session_after_turns(api, "helper", "one")
    async with open_stream(api, sid) as (_, stream):
        await stream.until(lambda frames: len(frames) >= 3, "a few stored events")
        await api.post(f"/api/sessions/{sid}/messages", {"text": "two"})
        # Cut as soon as turn 2 has begun: the rest of it commits while nobody listens.
        first = await stream.until(
            frames_where(lambda e: e["type"] == "turn/start" and e["data"]["turn"] == 2),
            "turn 2 starting",
        )
    await api.post(f"/api/sessions/{sid}/messages", {"text": "three"})
    last = first[-1].seq
    # Last-Event-ID wins over after_seq.
    params = {"after_seq": "0"}
    async with open_stream(api, sid, params, **{"Last-Event-ID": str(last)}) as (_, stream):
        second = await stream.until(turn_ended(3), "turn 3 ending")
    assert second[0].seq == last + 1
    union = seqs(first) + seqs(second)
    assert union == list(range(len(union)))
    stored = await api.events(sid)
    assert [check_framing(f) for f in first + second] == stored[: len(union)]
    assert len(stored) == len(union)  # nothing after turn 3 ended


async def test_after_seq_query(api: Api) -> None:
    sid = await session_after_turns(api, "talker", "a", "b")
    stored = await api.events(sid)
    middle = len(stored) // 2
    async with open_stream(api, sid, {"after_seq": str(middle)}) as (_, stream):
        frames = await stream.until(has_seq(stored[-1]["seq"]), "the rest")
    assert [check_framing(f) for f in frames] == stored[middle + 1 :]
    # After the last stored event: nothing until a new one, then exactly from there.
    end = stored[-1]["seq"]
    async with open_stream(api, sid, {"after_seq": str(end)}) as (_, stream):
        await api.post(f"/api/sessions/{sid}/messages", {"text": "c"})
        frames = await stream.until(turn_ended(3), "turn 3")
    assert frames[0].seq == end + 1
    assert [check_framing(f) for f in frames] == (await api.events(sid))[end + 1 :][: len(frames)]
