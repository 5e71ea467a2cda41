"""What the API tests share: servers per module, a JSON client, polls, SSE and raw HTTP, logs.

The tests hold ``dsh-agent serve`` to its contract from outside (docs/design.md#serve): every
request is real loopback HTTP, through ``httpx`` or, where httpx would normalise the request
(``..`` in a path) or could not send it cleanly (a body the server refuses half-way), through a
plain socket; what the server says is compared with what the store holds, read with
``store_from_url`` as any other process would. ``Servers`` shares the processes of
``module_serve_factory`` between the tests of a module. Waits are polls for a condition with an
upper bound, never timed assertions.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import httpx
import trio

from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.stores import store_from_url

from .conftest import Served, StartServed

T = TypeVar("T")

#: Upper bound of every poll (a worker activates, runs a scripted turn, commits).
WAIT = 30.0
#: Seconds between two looks of a poll.
EVERY = 0.05


async def poll(what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = WAIT) -> T:
    """Call ``probe`` until it returns something truthy; return it (fail after ``timeout``)."""
    last: T | None = None
    with trio.move_on_after(timeout):
        while True:
            last = await probe()
            if last:
                return last
            await trio.sleep(EVERY)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``response`` is the contract's error: ``status``, JSON ``{"error": {code, message}}``."""
    detail = f"{response.request.method} {response.request.url} -> {response.status_code}"
    assert response.status_code == status, f"{detail}: {response.text[:500]}"
    assert response.headers["content-type"].startswith("application/json"), detail
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["code"] == code, f"{detail}: {body}"
    assert isinstance(error["message"], str), body
    assert error["message"].strip(), body
    return dict(error)


class Api:
    """The JSON API of one server, through one ``httpx.AsyncClient``."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        """``GET path`` that must answer 200 with JSON; the decoded body."""
        response = await self.http.get(path, params=params)
        assert response.status_code == 200, f"GET {path} {params}: {response.text[:500]}"
        assert response.headers["content-type"].startswith("application/json")
        return response.json()

    async def post(self, path: str, body: Any, status: int | tuple[int, ...] = 202) -> Any:
        """``POST path`` with a JSON body that must answer ``status``; the decoded body."""
        response = await self.http.post(path, json=body)
        wanted = status if isinstance(status, tuple) else (status,)
        assert response.status_code in wanted, f"POST {path} {body}: {response.text[:500]}"
        return response.json()

    async def create(self, agent: str | None = None, prompt: str | None = None, **more: Any) -> str:
        """``POST /api/sessions``; the new session's id (checked against the answer's agent)."""
        body: dict[str, Any] = dict(more)
        if agent is not None:
            body["agent"] = agent
        if prompt is not None:
            body["prompt"] = prompt
        created = await self.post("/api/sessions", body, status=201)
        assert isinstance(created["id"], str), created
        if agent is not None:
            assert created["agent"] == agent, created
        return str(created["id"])

    async def session(self, sid: str) -> dict[str, Any]:
        """``GET /api/sessions/{sid}``: the detail object."""
        detail: dict[str, Any] = await self.get(f"/api/sessions/{sid}")
        return detail

    async def events(self, sid: str, **params: Any) -> list[dict[str, Any]]:
        """``GET /api/sessions/{sid}/events`` with ``params``: the events list."""
        body = await self.get(f"/api/sessions/{sid}/events", params=params)
        events: list[dict[str, Any]] = body["events"]
        return events

    async def wait_session(
        self, sid: str, check: Callable[[dict[str, Any]], object], what: str
    ) -> dict[str, Any]:
        """Poll the detail of ``sid`` until ``check(detail)``; return it.

        A session the fleet has queued but not created yet may answer 404 for a moment.
        """

        async def probe() -> dict[str, Any] | None:
            response = await self.http.get(f"/api/sessions/{sid}")
            if response.status_code == 404:
                return None
            assert response.status_code == 200, response.text[:500]
            detail: dict[str, Any] = response.json()
            return detail if check(detail) else None

        return await poll(f"{sid}: {what}", probe)

    async def wait_events(
        self, sid: str, check: Callable[[list[dict[str, Any]]], object], what: str
    ) -> list[dict[str, Any]]:
        """Poll every event of ``sid`` until ``check(events)``; return them."""

        async def probe() -> list[dict[str, Any]] | None:
            response = await self.http.get(f"/api/sessions/{sid}/events")
            if response.status_code == 404:
                return None
            assert response.status_code == 200, response.text[:500]
            events: list[dict[str, Any]] = response.json()["events"]
            return events if check(events) else None

        return await poll(f"{sid}: {what}", probe)


# --- servers shared by the tests of a module ------------------------------------------------


class Servers:
    """Servers of ``module_serve_factory`` started on first use, one per name.

    Starting ``dsh-agent serve`` and ``dsh-agent worker`` takes a few seconds of this machine's
    two cores, so a module's tests share them (the factory stops them when the module is done);
    each test makes its own sessions.
    """

    def __init__(self, start: StartServed) -> None:
        self._start = start
        self._started: dict[str, Served] = {}

    def get(self, backend: str = "sqlite", *, name: str | None = None, **options: Any) -> Served:
        """The server called ``name`` (default: the backend's), started with ``options``."""
        key = name or backend
        if key not in self._started:
            self._started[key] = self._start(backend, **options)
        return self._started[key]


@asynccontextmanager
async def open_api(served: Served, **headers: str) -> AsyncIterator[Api]:
    """An ``Api`` on ``served`` (its token as a bearer unless ``headers`` say otherwise)."""
    if served.token is not None:
        headers.setdefault("Authorization", f"Bearer {served.token}")
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=WAIT) as http:
        yield Api(http)


# --- raw HTTP: what httpx would normalise or could not send cleanly ---------------------------


@dataclass
class RawResponse:
    """A response read off a socket: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


def _parse_response(data: bytes, eof: bool) -> RawResponse | None:
    """The response in ``data`` once complete (``Content-Length`` read, or at EOF), else None."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(status_line.split()[1])
    length = headers.get("content-length")
    if length is None:
        return RawResponse(status, headers, body) if eof else None
    if len(body) < int(length):
        return None
    return RawResponse(status, headers, body[: int(length)])


async def raw_request(base_url: str, head: str, body: Iterator[bytes] | bytes = b"") -> RawResponse:
    """Send ``head`` (request line and headers, ``\\n``-separated) and ``body`` on a new socket.

    The body is written while the response is read: a server that answers early (413) and
    closes is read before its close can reset the connection.
    """
    url = httpx.URL(base_url)
    assert url.host
    assert url.port
    stream = await trio.open_tcp_stream(url.host, url.port)
    lines = head.strip("\n").split("\n")
    if not any(line.lower().startswith("connection:") for line in lines):
        lines.append("Connection: close")
    request = "\r\n".join(lines).encode() + b"\r\n\r\n"
    chunks = [body] if isinstance(body, bytes) else body
    received = b""
    parsed: RawResponse | None = None

    async def send() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(request)
            for chunk in chunks:
                await stream.send_all(chunk)

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(send)
        with trio.fail_after(WAIT):
            while parsed is None:
                try:
                    data = await stream.receive_some()
                except trio.BrokenResourceError:
                    data = b""
                received += data
                parsed = _parse_response(received, eof=not data)
                assert data or parsed, f"connection closed: {received[:300]!r}"
        nursery.cancel_scope.cancel()
    return parsed


# --- reading a session's log -----------------------------------------------------------------


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The events of type ``kind``."""
    return [e for e in events if e["type"] == kind]


def turn_ends(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reasons of the ``turn/end`` events, in order."""
    return [e["data"]["reason"] for e in of_type(events, "turn/end")]


def ended_turns(count: int) -> Callable[[list[dict[str, Any]]], bool]:
    """A check: at least ``count`` turns ended and none is open."""

    def check(events: list[dict[str, Any]]) -> bool:
        starts = len(of_type(events, "turn/start"))
        ends = len(of_type(events, "turn/end"))
        return ends >= count and starts == ends

    return check


def texts(events: list[dict[str, Any]]) -> list[str]:
    """Every text block of the ``assistant/message`` events, in order."""
    found = []
    for event in of_type(events, "assistant/message"):
        content = event["data"].get("message", event["data"]).get("content", "")
        if isinstance(content, str):
            found.append(content)
            continue
        found.extend(str(b["text"]) for b in content if b.get("type") == "text")
    return found


def tag(what: str) -> str:
    """A session id prefix no other test (or earlier run on the same server) uses."""
    return f"{what}-{secrets.token_hex(4)}"


def usage_sums(events: list[dict[str, Any]]) -> tuple[int, int]:
    """Input and output tokens the ``assistant/message`` events report."""
    used = [e["data"].get("usage") or {} for e in of_type(events, "assistant/message")]
    return sum(u.get("input_tokens", 0) for u in used), sum(u.get("output_tokens", 0) for u in used)


def inserted(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(target, message id)`` of every message the log's inbox splices inserted."""
    return [
        (e["data"]["target"], m["id"])
        for e in of_type(events, "agent/inbox/spliced")
        for m in e["data"].get("inserted", ())
    ]


async def alive_workers(api: Api) -> set[str]:
    """Ids of the workers ``/api/fleet`` shows alive."""
    fleet = await api.get("/api/fleet")
    return {w["worker_id"] for w in fleet["workers"] if w["alive"]}


def check_summary_fields(summary: dict[str, Any]) -> None:
    """Every field of the contract's summary, with its type."""
    keys = {
        "id", "agent", "status", "created_at", "last_activity", "events", "turns", "tokens",
        "parent", "forked_from", "owner", "pending_approvals", "last_turn_end",
    }  # fmt: skip
    assert keys <= set(summary), sorted(keys - set(summary))
    assert summary["status"] in {"idle", "running", "awaiting-approval", "unowned"}
    datetime.fromisoformat(summary["created_at"])
    assert set(summary["tokens"]) == {"input", "output", "total"}


async def stored_events(url: str, sid: str) -> list[dict[str, Any]]:
    """Every stored event of ``sid`` as ``event_to_json`` writes it, read from the store."""
    store = store_from_url(url)
    try:
        reader = await store.open(sid, "read")
        try:
            found: list[dict[str, Any]] = []
            while batch := await reader.read(len(found)):
                found.extend(json.loads(event_to_json(e)) for e in batch)
            return found
        finally:
            await reader.close()
    finally:
        await store.aclose()


# --- server-sent events ----------------------------------------------------------------------


@dataclass
class Frame:
    """One SSE frame: its fields, and the exact text it arrived as."""

    raw: str
    id: str | None = None
    event: str | None = None
    data: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)

    @property
    def seq(self) -> int:
        """The ``id:`` field as the event's seq."""
        assert self.id is not None, self.raw
        return int(self.id)

    def json(self) -> dict[str, Any]:
        """The ``data:`` lines, joined, as JSON."""
        value: dict[str, Any] = json.loads("\n".join(self.data))
        return value


def parse_frame(raw: str) -> Frame:
    """A frame from its text (the lines between two blank lines)."""
    frame = Frame(raw)
    for line in raw.split("\n"):
        if line.startswith(":"):
            frame.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            frame.id = value
        elif name == "event":
            frame.event = value
        elif name == "data":
            frame.data.append(value)
    return frame


@dataclass
class SseReader:
    """Frames of an open ``text/event-stream`` response, read as they arrive."""

    chunks: AsyncIterator[str]
    frames: list[Frame] = field(default_factory=list)
    _buffer: str = ""

    @property
    def events(self) -> list[Frame]:
        """The frames that carry an event (comments left out)."""
        return [f for f in self.frames if f.id is not None]

    async def until(self, check: Callable[[list[Frame]], object], what: str) -> list[Frame]:
        """Read until ``check(self.events)`` holds (bounded); return the event frames."""
        with trio.move_on_after(WAIT):
            while not check(self.events):
                chunk = await anext(self.chunks)
                self._buffer += chunk.replace("\r\n", "\n")
                *done, self._buffer = self._buffer.split("\n\n")
                self.frames.extend(parse_frame(raw) for raw in done if raw)
            return self.events
        seen = [f.id for f in self.events]
        raise AssertionError(f"stream: timed out waiting for {what} (seqs so far {seen})")


@asynccontextmanager
async def open_stream(
    api: Api, sid: str, params: Mapping[str, Any] | None = None, **headers: str
) -> AsyncIterator[tuple[httpx.Response, SseReader]]:
    """``GET /api/sessions/{sid}/stream``: the response, and a reader of its frames.

    Leaving closes the connection (a client going away mid-stream).
    """
    path = f"/api/sessions/{sid}/stream"
    async with api.http.stream("GET", path, params=params, headers=headers) as response:
        chunks = response.aiter_text()
        try:
            yield response, SseReader(chunks)
        finally:
            # Closing only the outer iterator would leave httpx's inner ones suspended (trio
            # warns when they are collected); cancelled at a read, every layer finishes.
            with trio.move_on_after(0), contextlib.suppress(httpx.HTTPError):
                async for _ in chunks:
                    pass


def seqs(frames: list[Frame]) -> list[int]:
    """The seqs of event frames, in arrival order."""
    return [f.seq for f in frames]


def has_seq(seq: int) -> Callable[[list[Frame]], bool]:
    """A check: some frame carries ``seq``."""
    return lambda frames: any(f.seq == seq for f in frames)


def frames_where(
    check: Callable[[dict[str, Any]], object],
) -> Callable[[list[Frame]], bool]:
    """A check: some frame's event satisfies ``check``."""
    return lambda frames: any(check(f.json()) for f in frames)
