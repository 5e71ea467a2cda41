"""The JSON API's handlers: sessions, events, messages, commands, agents, fleet (docs/serve.md).

Every handler reads ``request.app.state.ctx`` (``ServeContext``) and the ``Digests`` cache on
``request.app.state.digests``; every write goes through the fleet client, so whichever worker
holds a session (or claims it next) applies it. Handlers raise ``ApiError`` or let the runtime's
coded errors through; ``app.py`` turns both into JSON error replies.

Listing reads the store's session list, filters by ``agent`` and ``q`` on it, orders newest
first (creation time, then id, so a cursor is stable while sessions are added), and digests only
as many sessions as the page needs (``status`` is filtered after digesting). A command waits a
few seconds for a worker to apply it; when none did it stays queued and the reply says
``applied: false``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import attrs
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._errors import SessionNotFoundError
from .._frozen import thaw
from .._session.store import SessionInfo
from ..events import event_to_json
from ..fleet import FleetCommandError
from .context import ServeContext
from .digest import STATUSES, Digest, Digests
from .replies import ApiError, bad, field, json_body

#: Largest ``limit`` of a session list / of an events read.
MAX_LIST: Final = 500
MAX_EVENTS: Final = 10_000
MESSAGE_KINDS: Final = ("followup", "steer", "inject")


def state_of(request: Request) -> tuple[ServeContext, Digests]:
    """The server's context and digest cache (``app.state``)."""
    state = request.app.state
    return state.ctx, state.digests


def int_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    """Query ``name`` as an integer from ``low`` to ``high`` (absent: ``default``).

    Raises:
        ApiError: 400 naming the query when it is not such an integer.
    """
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad(f"query {name!r} must be an integer") from None
    if not low <= value <= high:
        raise bad(f"query {name!r} must be from {low} to {high}")
    return value


def _cursor_of(info: SessionInfo) -> str:
    raw = json.dumps([info.created_at, info.session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after_cursor(cursor: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, sid = json.loads(raw)
    except (ValueError, TypeError):
        raise bad("query 'cursor' is not a cursor this server gave") from None
    if not isinstance(created, str) or not isinstance(sid, str):
        raise bad("query 'cursor' is not a cursor this server gave")
    return created, sid


def _candidates(infos: Sequence[SessionInfo], request: Request) -> list[SessionInfo]:
    """The sessions the list's ``agent``, ``q`` and ``cursor`` admit, newest first."""
    agent = request.query_params.get("agent") or None
    needle = (request.query_params.get("q") or "").casefold()
    cursor = request.query_params.get("cursor")
    after = _after_cursor(cursor) if cursor else None

    def admitted(info: SessionInfo) -> bool:
        if agent is not None and info.agent_id != agent:
            return False
        if needle and needle not in f"{info.session_id}\n{info.agent_id}".casefold():
            return False
        return after is None or (info.created_at, info.session_id) < after

    out = [info for info in infos if admitted(info)]
    out.sort(key=lambda i: (i.created_at, i.session_id), reverse=True)
    return out


async def _digest(digests: Digests, info: SessionInfo) -> Digest | None:
    try:
        return await digests.of(info)
    except SessionNotFoundError:  # deleted since the list was read
        return None


async def list_sessions(request: Request) -> Response:
    """``GET /api/sessions``: one page of session summaries, newest first."""
    ctx, digests = state_of(request)
    limit = int_query(request, "limit", 50, 1, MAX_LIST)
    status = request.query_params.get("status") or None
    if status is not None and status not in STATUSES:
        raise bad(f"query 'status' must be one of {', '.join(STATUSES)}")
    candidates = _candidates(await ctx.client.store.list(), request)
    page: list[dict[str, Any]] = []
    last: SessionInfo | None = None
    index = 0
    while index < len(candidates) and len(page) < limit:
        batch = candidates[index : index + max(limit, 50)]
        owners = await ctx.client.owners([info.session_id for info in batch])
        for info in batch:
            index += 1
            digest = await _digest(digests, info)
            if digest is None:
                continue
            summary = digest.summary(owners.get(info.session_id))
            if status is None or summary["status"] == status:
                page.append(summary)
                last = info
                if len(page) == limit:
                    break
    more = index < len(candidates)
    next_cursor = _cursor_of(last) if more and last is not None else None
    if more and last is None and candidates:  # a status filter matched nothing in this span
        next_cursor = _cursor_of(candidates[index - 1])
    return JSONResponse({"sessions": page, "next_cursor": next_cursor})


async def _known(ctx: ServeContext, digests: Digests, sid: str) -> Digest:
    """The session's current digest (an empty one while the fleet has it queued for creation).

    Raises:
        ApiError: 404 when neither the store nor the fleet has such a session.
    """
    if not 0 < len(sid) <= 200:
        raise ApiError(404, "SESSION_NOT_FOUND", "no such session")
    info = await ctx.client.store.stat(sid)
    digest = None if info is None else await _digest(digests, info)
    if digest is None:
        queued = await ctx.client.queued(sid)
        if queued is None:
            raise ApiError(404, "SESSION_NOT_FOUND", f"session {sid!r} not found")
        when = datetime.fromtimestamp(queued[1], UTC).isoformat(timespec="milliseconds")
        digest = Digest(SessionInfo(sid, queued[0], when, 0, None), {})
    return digest


async def _children(ctx: ServeContext, digests: Digests, parent: Digest) -> list[dict[str, str]]:
    """Sub-agent sessions of ``parent`` and its forks (sessions created no earlier than it).

    Only their headers are read, each once for the server's life (``Digests.links``).
    """
    out: list[dict[str, str]] = []
    for info in await ctx.client.store.list():
        if info.created_at < parent.created_at or info.session_id == parent.session_id:
            continue
        try:
            up, source = await digests.links(info)
        except SessionNotFoundError:  # deleted since the list was read
            continue
        if up == parent.session_id:
            out.append({"id": info.session_id, "relation": "subagent"})
        elif source == parent.session_id:
            out.append({"id": info.session_id, "relation": "fork"})
    return out


async def session_detail(request: Request) -> Response:
    """``GET /api/sessions/{id}``: the summary, header, children and pending calls."""
    ctx, digests = state_of(request)
    digest = await _known(ctx, digests, request.path_params["sid"])
    owner = await ctx.client.owner(digest.session_id)
    body = digest.summary(owner)
    body["header"] = json.loads(json.dumps(thaw(digest.header), default=str))
    body["children"] = await _children(ctx, digests, digest)
    body["pending"] = json.loads(json.dumps(digest.pending(), default=str))
    return JSONResponse(body)


async def session_events(request: Request) -> Response:
    """``GET /api/sessions/{id}/events?after_seq=&limit=``: committed events, in order."""
    ctx, digests = state_of(request)
    sid = request.path_params["sid"]
    after = int_query(request, "after_seq", -1, -1, 2**62)
    limit = int_query(request, "limit", 1000, 1, MAX_EVENTS)
    await _known(ctx, digests, sid)
    try:
        reader = await ctx.client.store.open(sid, "read")
    except SessionNotFoundError:  # queued for creation: no event yet
        return Response('{"events":[]}', media_type="application/json")
    try:
        events = await reader.read(after + 1)
    finally:
        await reader.close()
    text = ",".join(event_to_json(event) for event in events[:limit])
    return Response('{"events":[' + text + "]}", media_type="application/json")


async def send_message(request: Request) -> Response:
    """``POST /api/sessions/{id}/messages {text, kind}``: accepted (202) once durable."""
    ctx, _ = state_of(request)
    sid = request.path_params["sid"]
    body = await json_body(request)
    text = field(body, "text", str)
    if not text:
        raise bad("field 'text' is required (a non-empty string)")
    kind = field(body, "kind", str, "followup")
    if kind not in MESSAGE_KINDS:
        raise bad(f"field 'kind' must be one of {', '.join(MESSAGE_KINDS)}")
    await known_or_queued(ctx, sid)
    message_id = await ctx.client.send(sid, text, kind=kind or "followup")
    return JSONResponse({"message_id": message_id}, status_code=202)


async def known_or_queued(ctx: ServeContext, sid: str) -> None:
    """Pass when the store has ``sid`` or the fleet has it queued for creation.

    Raises:
        ApiError: 404 ``SESSION_NOT_FOUND`` otherwise.
    """
    if not 0 < len(sid) <= 200 or not await ctx.client.known(sid):
        raise ApiError(404, "SESSION_NOT_FOUND", f"session {sid!r} not found")


async def _applied(ctx: ServeContext, command: Any) -> bool:
    """Run a waiting fleet command for up to ``command_wait``; True when a worker applied it."""
    with trio.move_on_after(ctx.command_wait):
        await command()
        return True
    return False


async def cancel(request: Request) -> Response:
    """``POST /api/sessions/{id}/cancel {keep_inbox?}``."""
    ctx, _ = state_of(request)
    sid = request.path_params["sid"]
    body = await json_body(request, empty_ok=True)
    keep = bool(field(body, "keep_inbox", bool, False))
    await known_or_queued(ctx, sid)
    applied = await _applied(ctx, lambda: ctx.client.cancel(sid, keep_inbox=keep))
    return JSONResponse({"applied": applied}, status_code=202)


async def decide(request: Request) -> Response:
    """``POST /api/sessions/{id}/approvals/{call_id} {decision, message?, always?}``."""
    ctx, digests = state_of(request)
    sid, call_id = request.path_params["sid"], request.path_params["call_id"]
    body = await json_body(request)
    decision = field(body, "decision", str)
    if decision not in ("approve", "deny"):
        raise bad("field 'decision' must be 'approve' or 'deny'")
    message = field(body, "message", str)
    always = bool(field(body, "always", bool, False))
    digest = await _known(ctx, digests, sid)
    if call_id not in {p["call_id"] for p in digest.pending()}:
        raise ApiError(
            409, "NOT_AWAITING_APPROVAL", f"call {call_id!r} is not waiting for a decision"
        )
    if decision == "approve":
        command = lambda: ctx.client.approve(sid, call_id, always=always)  # noqa: E731
    else:
        command = lambda: ctx.client.deny(sid, call_id, message)  # noqa: E731
    try:
        applied = await _applied(ctx, command)
    except FleetCommandError as exc:
        raise ApiError(409, "NOT_AWAITING_APPROVAL", str(exc)) from None
    return JSONResponse({"applied": applied}, status_code=200 if applied else 202)


async def create(request: Request) -> Response:
    """``POST /api/sessions {agent?, session_id?, prompt?}``: queued for the fleet (201)."""
    ctx, _ = state_of(request)
    body = await json_body(request, empty_ok=True)
    agent = field(body, "agent", str)
    sid = field(body, "session_id", str)
    prompt = field(body, "prompt", str)
    if sid is not None and not 0 < len(sid) <= 200:
        raise bad("field 'session_id' must be 1 to 200 characters")
    options = ctx.agent(agent)
    new = await ctx.create_session(options.id, sid, prompt or None)
    return JSONResponse({"id": new, "agent": options.id}, status_code=201)


async def agents(request: Request) -> Response:
    """``GET /api/agents``: the agents ``create`` accepts."""
    ctx, _ = state_of(request)
    rows = [
        {"id": key, "provider": options.provider, "model": options.model}
        for key, options in ctx.agents.items()
    ]
    return JSONResponse({"agents": rows})


async def fleet(request: Request) -> Response:
    """``GET /api/fleet``: the workers and what waits."""
    ctx, _ = state_of(request)
    status = await ctx.client.status()
    return JSONResponse(
        {
            "workers": [attrs.asdict(worker) for worker in status.workers],
            "sessions_waiting": status.sessions_waiting,
            "undelivered": status.undelivered,
            "oldest_undelivered_age_s": status.oldest_undelivered_age,
        }
    )
