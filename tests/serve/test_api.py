"""The JSON API of ``dsh-agent serve``, from outside, over SQLite and PostgreSQL.

A real server process and a real worker process share the store (``conftest.py``'s agents);
every request is loopback HTTP. What the server reports is compared with what the store holds:
sessions appear with their agent, status, turns and tokens; events read back exactly as stored;
messages, cancels and approval decisions reach the worker and show in the log
(docs/design.md#serve). Every error answer of the contract is checked on SQLite only, but for a
store failure: PostgreSQL's tables can be dropped under a running server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
import trio

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, open_runtime
from dsh_agent_loop.stores import store_from_url

from .api_helpers import (
    Api,
    Servers,
    alive_workers,
    assert_error,
    check_summary_fields,
    ended_turns,
    inserted,
    of_type,
    open_api,
    raw_request,
    stored_events,
    tag,
    texts,
    turn_ends,
    usage_sums,
)
from .conftest import PG_TABLES, Served

# --- sessions: create, list, detail ----------------------------------------------------------


async def test_created_session_reports_its_turn(api: Api, live: Served) -> None:
    sid = await api.create("helper", prompt="look around", session_id=tag("helper"))
    detail = await api.wait_session(sid, lambda d: d["turns"] == 1 and d["status"] == "idle", "1")
    events = await stored_events(live.store_url, sid)
    check_summary_fields(detail)
    assert (detail["id"], detail["agent"]) == (sid, "helper")
    assert detail["events"] == len(events)
    assert detail["last_activity"] == pytest.approx(events[-1]["time"])
    assert detail["last_turn_end"] == {"kind": "completed"}
    assert detail["owner"] in await alive_workers(api)
    assert (detail["parent"], detail["forked_from"], detail["pending_approvals"]) == (None, None, 0)
    assert (detail["children"], detail["pending"]) == ([], [])
    tokens_in, tokens_out = usage_sums(events)
    assert detail["tokens"] == {
        "input": tokens_in,
        "output": tokens_out,
        "total": tokens_in + tokens_out,
    }
    assert tokens_in > 0
    assert tokens_out > 0
    # The helper's turn: reasoning and text, a list_dir call and its result, then the answer.
    assert "look around" in json.dumps(of_type(events, "user/message"))
    assert [r["data"]["message"]["name"] for r in of_type(events, "tool/result")] == ["list_dir"]
    assert texts(events) == ["Let me look.", "done looking"]
    header = detail["header"]
    assert (header["session_id"], header["agent_id"]) == (sid, "helper")
    # The list shows the same summary as the detail's base.
    listed = await api.get("/api/sessions", {"q": sid})
    assert listed["next_cursor"] is None
    base = {k: v for k, v in detail.items() if k not in {"header", "children", "pending"}}
    assert listed["sessions"] == [base]


async def test_create_picks_the_default_agent_and_lists_agents(api: Api) -> None:
    agents = await api.get("/api/agents")
    ids = [a["id"] for a in agents["agents"]]
    assert ids == ["helper", "guarded", "slow", "talker"]
    assert {(a["provider"], a["model"]) for a in agents["agents"]} >= {("steps", "m")}
    created = await api.post("/api/sessions", {}, status=201)
    assert created["agent"] == "helper"
    detail = await api.wait_session(created["id"], lambda d: d["agent"] == "helper", "created")
    assert detail["turns"] == 0


async def test_events_read_back_exactly_as_stored(api: Api, live: Served) -> None:
    sid = await api.create("talker", prompt="one", session_id=tag("events"))
    await api.wait_events(sid, ended_turns(1), "turn 1")
    await api.post(f"/api/sessions/{sid}/messages", {"text": "two"})
    everything = await api.wait_events(sid, ended_turns(2), "turn 2")
    stored = await stored_events(live.store_url, sid)
    assert everything == stored
    assert [e["seq"] for e in everything] == list(range(len(stored)))
    n = len(stored)
    assert await api.events(sid, after_seq=-1) == stored
    assert await api.events(sid, after_seq=3) == stored[4:]
    assert await api.events(sid, limit=3) == stored[:3]
    assert await api.events(sid, after_seq=2, limit=2) == stored[3:5]
    assert await api.events(sid, after_seq=n - 1) == []
    assert await api.events(sid, after_seq=n + 50) == []
    assert await api.events(sid, limit=10_000) == stored


async def test_fleet_shows_the_live_worker(api: Api, live: Served) -> None:
    fleet = await api.get("/api/fleet")
    assert {"workers", "sessions_waiting", "undelivered", "oldest_undelivered_age_s"} <= set(fleet)
    alive = [w for w in fleet["workers"] if w["alive"]]
    assert len(alive) == 1
    [worker] = alive
    keys = {"worker_id", "host", "pid", "started_at", "last_heartbeat", "live_agents"}
    assert keys | {"max_agents", "state"} <= set(worker)
    assert live.worker is not None
    assert worker["pid"] == live.worker.process.pid
    assert worker["max_agents"] >= 1


# --- status transitions, commands ------------------------------------------------------------


async def test_cancel_aborts_a_running_turn(api: Api) -> None:
    sid = await api.create("slow", prompt="take your time", session_id=tag("slow"))
    try:
        await cancel_twice(api, sid)
    finally:  # a slow turn left running would hold up the worker's stop for its drain
        await api.http.post(f"/api/sessions/{sid}/cancel", json={})


async def cancel_twice(api: Api, sid: str) -> None:
    running = await api.wait_session(sid, lambda d: d["status"] == "running", "running")
    assert running["turns"] == 1
    assert running["last_turn_end"] is None
    path = f"/api/sessions/{sid}/messages"
    kept = await api.post(path, {"text": "next, please"})
    await api.wait_events(
        sid, lambda ev: ("next-turn", kept["message_id"]) in inserted(ev), "queued behind"
    )
    # keep_inbox: the turn ends and the queued message stays (until something wakes it).
    assert await api.post(f"/api/sessions/{sid}/cancel", {"keep_inbox": True}) == {"applied": True}
    idle = await api.wait_session(sid, lambda d: d["status"] == "idle", "idle after cancel 1")
    assert idle["turns"] == 1
    assert idle["last_turn_end"] == {"kind": "aborted", "cause": "user"}
    events = await api.events(sid)
    assert [e for e in of_type(events, "agent/inbox/spliced") if e["data"].get("outcome")] == []
    # The next wake runs the kept message first; what is queued behind it is cleared by a cancel.
    dropped = await api.post(path, {"text": "never mind"})
    await api.wait_session(
        sid, lambda d: d["status"] == "running" and d["turns"] == 2, "turn 2 running"
    )
    events = await api.wait_events(
        sid, lambda ev: ("next-turn", dropped["message_id"]) in inserted(ev), "queued behind"
    )
    second_start = of_type(events, "turn/start")[1]["seq"]
    claimed = [e for e in of_type(events, "user/message") if e["seq"] > second_start]
    assert "next, please" in json.dumps(claimed)
    assert await api.post(f"/api/sessions/{sid}/cancel", {}) == {"applied": True}
    detail = await api.wait_session(
        sid, lambda d: d["status"] == "idle" and d["turns"] == 2, "idle after cancel 2"
    )
    assert detail["last_turn_end"] == {"kind": "aborted", "cause": "user"}
    events = await api.wait_events(sid, ended_turns(2), "turn 2 ended")
    assert [r["kind"] for r in turn_ends(events)] == ["aborted", "aborted"]
    cleared = [
        e for e in of_type(events, "agent/inbox/spliced") if e["data"].get("outcome") == "canceled"
    ]
    assert len(cleared) == 1
    assert cleared[0]["seq"] > second_start
    assert "never mind" not in json.dumps(of_type(events, "user/message"))


async def test_followup_and_steer_reach_the_log(api: Api) -> None:
    sid = await api.create("talker", prompt="hi", session_id=tag("msgs"))
    await api.wait_events(sid, ended_turns(1), "turn 1")
    followup = await api.post(f"/api/sessions/{sid}/messages", {"text": "again"})
    events = await api.wait_events(sid, ended_turns(2), "turn 2")
    assert ("next-turn", followup["message_id"]) in inserted(events)
    steer = await api.post(
        f"/api/sessions/{sid}/messages", {"text": "this way", "kind": "steer"}, status=202
    )
    events = await api.wait_events(sid, ended_turns(3), "turn 3")
    assert ("next-step", steer["message_id"]) in inserted(events)
    assert followup["message_id"] != steer["message_id"]
    # An injected message wakes nothing: it rides along with the next turn's first step.
    inject = await api.post(f"/api/sessions/{sid}/messages", {"text": "fyi", "kind": "inject"})
    last = await api.post(f"/api/sessions/{sid}/messages", {"text": "and now?"})
    events = await api.wait_events(
        sid,
        lambda ev: ("next-turn", last["message_id"]) in inserted(ev) and ended_turns(4)(ev),
        "the turn after the injected message",
    )
    assert ("next-step", inject["message_id"]) in inserted(events)
    assert texts(events) == ["hello from talker"] * 4
    detail = await api.session(sid)
    assert detail["turns"] == 4
    third_end = of_type(events, "turn/end")[2]["seq"]
    later = [e for e in of_type(events, "user/message") if e["seq"] > third_end]
    assert "fyi" in json.dumps(later)


async def test_approve_then_deny(api: Api, live: Served) -> None:
    sid = await api.create("guarded", prompt="write it", session_id=tag("guarded"))
    waiting = await api.wait_session(
        sid, lambda d: d["status"] == "awaiting-approval", "awaiting approval"
    )
    assert waiting["pending_approvals"] == 1
    assert waiting["last_turn_end"]["kind"] == "awaiting-approval"
    [pending] = waiting["pending"]
    assert pending["name"] == "write_file"
    assert pending["arguments"] == {"path": "out.txt", "content": "hi"}
    call = pending["call_id"]
    [asked] = of_type(await api.events(sid), "tool/approval-requested")
    assert (asked["data"]["call_id"], asked["data"]["turn"]) == (call, pending["turn"])
    assert await api.post(
        f"/api/sessions/{sid}/approvals/{call}", {"decision": "approve"}, 200
    ) == {"applied": True}
    events = await api.wait_events(sid, ended_turns(2), "the continuation turn")
    [result] = [
        r for r in of_type(events, "tool/result") if r["data"]["message"]["call_id"] == call
    ]
    assert "error" not in result["data"]
    assert texts(events)[-1] == "finished"
    assert (live.cwd / "out.txt").read_text() == "hi"
    detail = await api.wait_session(sid, lambda d: d["status"] == "idle", "idle")
    assert (detail["pending"], detail["pending_approvals"]) == ([], 0)
    # Deciding it again: it waits no more.
    again = await api.http.post(f"/api/sessions/{sid}/approvals/{call}", json={"decision": "deny"})
    assert_error(again, 409, "NOT_AWAITING_APPROVAL")
    # A second call, denied with a message.
    await api.post(f"/api/sessions/{sid}/messages", {"text": "once more"})
    waiting = await api.wait_session(
        sid, lambda d: d["status"] == "awaiting-approval" and d["turns"] == 3, "second call"
    )
    [pending] = waiting["pending"]
    assert pending["call_id"] != call
    body = {"decision": "deny", "message": "not today"}
    reply = await api.post(f"/api/sessions/{sid}/approvals/{pending['call_id']}", body, 200)
    assert reply == {"applied": True}
    events = await api.wait_events(sid, ended_turns(4), "the denied continuation")
    [denied] = [
        r
        for r in of_type(events, "tool/result")
        if r["data"]["message"]["call_id"] == pending["call_id"]
    ]
    assert denied["data"]["error"]["code"] == "DENIED"
    assert "not today" in json.dumps(denied["data"]["message"]["content"])


# --- lists: filters and pages ----------------------------------------------------------------


async def test_list_filters_and_pages(api: Api) -> None:
    prefix = tag("Page")
    made = [await api.create("talker", session_id=f"{prefix}-{i}") for i in range(5)]
    made.append(await api.create("helper", session_id=f"{prefix}-h"))

    async def listed(**params: Any) -> list[str]:
        body = await api.get("/api/sessions", params)
        return [s["id"] for s in body["sessions"]]

    for sid in made:
        await api.wait_session(sid, lambda d: d["status"] == "idle", "created and held")
    assert sorted(await listed(q=prefix)) == sorted(made)
    assert sorted(await listed(q=prefix.upper())) == sorted(made)  # case-insensitive
    assert sorted(await listed(q=prefix, agent="talker")) == sorted(made[:5])
    assert await listed(q=prefix, agent="helper") == [made[5]]
    assert await listed(q=prefix, agent="guarded") == []
    assert sorted(await listed(q=prefix, status="idle")) == sorted(made)
    assert await listed(q=prefix, status="running") == []
    assert await listed(q=prefix, status="awaiting-approval") == []
    assert await listed(q=prefix, status="unowned") == []
    # q matches the agent id too.
    by_agent = await api.get("/api/sessions", {"q": "TALK", "limit": 500})
    assert {s["agent"] for s in by_agent["sessions"]} == {"talker"}
    assert set(made[:5]) <= {s["id"] for s in by_agent["sessions"]}
    # Pages of 2: every session once, newest created first, then no cursor.
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    while len(pages) < 10:
        params: dict[str, Any] = {"q": prefix, "limit": 2}
        if cursor is not None:
            params["cursor"] = cursor
        body = await api.get("/api/sessions", params)
        pages.append(body["sessions"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [2, 2, 2] or [len(p) for p in pages] == [2, 2, 2, 0]
    rows = [s for page in pages for s in page]
    assert sorted(s["id"] for s in rows) == sorted(made)
    created = [datetime.fromisoformat(s["created_at"]) for s in rows]
    assert created == sorted(created, reverse=True)
    assert await listed(q=prefix, limit=500) == [s["id"] for s in rows]


async def test_sub_agent_and_fork_links(api: Api, live: Served) -> None:
    prefix = tag("tree")
    parent_sid, child_sid, fork_sid = f"{prefix}-p", f"{prefix}-c", f"{prefix}-f"
    store = store_from_url(live.store_url)
    try:
        model = ScriptedModel([Reply.text("ok")], loop=True)
        async with open_runtime(store=store, providers={"scripted": model}) as rt:
            options = AgentOptions(id="lead", provider="scripted", model="m")
            parent = await rt.agents.create(session_id=parent_sid, options=options)
            await parent.agent.run("hello")
            await rt.agents.create(
                session_id=child_sid,
                options=AgentOptions(id="aide", provider="scripted", model="m"),
                parent_agent=parent.agent,
            )
            await parent.agent.flush()
            await rt.agents.fork(
                parent_sid,
                options=AgentOptions(id="alt", provider="scripted", model="m"),
                new_session_id=fork_sid,
            )
    finally:
        await store.aclose()
    detail = await api.session(parent_sid)
    assert sorted(detail["children"], key=lambda c: c["id"]) == [
        {"id": child_sid, "relation": "subagent"},
        {"id": fork_sid, "relation": "fork"},
    ]
    assert (detail["parent"], detail["forked_from"]) == (None, None)
    assert detail["status"] == "unowned"
    assert detail["owner"] is None
    child = await api.session(child_sid)
    assert (child["parent"], child["forked_from"], child["agent"]) == (parent_sid, None, "aide")
    fork = await api.session(fork_sid)
    assert (fork["forked_from"], fork["parent"], fork["agent"]) == (parent_sid, None, "alt")
    rows = (await api.get("/api/sessions", {"q": prefix}))["sessions"]
    assert {r["id"]: (r["parent"], r["forked_from"]) for r in rows} == {
        parent_sid: (None, None),
        child_sid: (parent_sid, None),
        fork_sid: (None, parent_sid),
    }


# --- last: the worker goes away (and a new one comes) ----------------------------------------


async def test_sessions_are_unowned_once_the_worker_stops(api: Api, live: Served) -> None:
    sid = await api.create("talker", prompt="hi", session_id=tag("owned"))
    held = await api.wait_session(sid, lambda d: d["status"] == "idle" and d["turns"], "idle")
    assert held["owner"] is not None
    assert live.worker is not None
    assert live.worker.stop() == 0
    gone = await api.wait_session(sid, lambda d: d["status"] == "unowned", "unowned")
    assert gone["owner"] is None
    assert sid in [
        s["id"] for s in (await api.get("/api/sessions", {"status": "unowned"}))["sessions"]
    ]
    # A message to it is queued (202) and the next worker runs it.
    await api.post(f"/api/sessions/{sid}/messages", {"text": "still there?"})
    live.start_worker()
    back = await api.wait_session(
        sid, lambda d: d["status"] == "idle" and d["turns"] == 2, "run by the new worker"
    )
    assert back["owner"] not in (None, held["owner"])


# --- every error answer (SQLite only) --------------------------------------------------------


@pytest.fixture
async def sqlite_api(servers: Servers) -> AsyncIterator[Api]:
    async with open_api(servers.get("sqlite")) as client:
        yield client


@pytest.fixture(scope="module")
def idle_sid(servers: Servers) -> str:
    """A talker session that ran one turn (shared by the error tests of the module)."""
    served = servers.get("sqlite")
    sid = served.create("talker", "hi", session_id=tag("errors"))
    served.wait_status(sid, "idle")
    return sid


UNKNOWN = "no-such-session"
SESSION_ROUTES = [
    ("GET", f"/api/sessions/{UNKNOWN}", None),
    ("GET", f"/api/sessions/{UNKNOWN}/events", None),
    ("GET", f"/api/sessions/{UNKNOWN}/stream", None),
    ("POST", f"/api/sessions/{UNKNOWN}/messages", {"text": "hi"}),
    ("POST", f"/api/sessions/{UNKNOWN}/cancel", {}),
    ("POST", f"/api/sessions/{UNKNOWN}/approvals/call-1", {"decision": "approve"}),
]


@pytest.mark.parametrize(("method", "path", "body"), SESSION_ROUTES)
async def test_unknown_session_is_404_on_every_route(
    sqlite_api: Api, method: str, path: str, body: Any
) -> None:
    response = await sqlite_api.http.request(method, path, json=body)
    assert_error(response, 404, "SESSION_NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/nothing"),
        ("GET", "/api/sessions/x/nothing"),
        ("POST", "/api/sessions/x/approvals"),
        ("GET", "/api"),
    ],
)
async def test_unknown_route_is_404(sqlite_api: Api, method: str, path: str) -> None:
    response = await sqlite_api.http.request(method, path, json={} if method == "POST" else None)
    assert_error(response, 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "/api/sessions"),
        ("PUT", "/api/sessions/x/messages"),
        ("GET", "/api/sessions/x/cancel"),
    ],
)
async def test_wrong_method_is_405(sqlite_api: Api, method: str, path: str) -> None:
    response = await sqlite_api.http.request(method, path)
    assert_error(response, 405, "METHOD_NOT_ALLOWED")


BAD_BODIES = [
    ("messages", b"{not json"),
    ("messages", b"[1, 2]"),
    ("messages", b'"text"'),
    ("messages", b"\xff\xfe"),
    ("messages", json.dumps({}).encode()),
    ("messages", json.dumps({"text": 12}).encode()),
    ("messages", json.dumps({"text": None}).encode()),
    ("messages", json.dumps({"text": "hi", "kind": "shout"}).encode()),
    ("messages", json.dumps({"text": "hi", "kind": 1}).encode()),
    ("cancel", b"{"),
    ("cancel", json.dumps({"keep_inbox": "yes"}).encode()),
    ("approvals/call-1", json.dumps({"decision": "maybe"}).encode()),
    ("approvals/call-1", json.dumps({}).encode()),
    ("approvals/call-1", json.dumps({"decision": "deny", "message": 5}).encode()),
    ("approvals/call-1", json.dumps({"decision": "approve", "always": "yes"}).encode()),
]


@pytest.mark.parametrize(("route", "raw"), BAD_BODIES)
async def test_bad_bodies_are_400(sqlite_api: Api, idle_sid: str, route: str, raw: bytes) -> None:
    response = await sqlite_api.http.post(
        f"/api/sessions/{idle_sid}/{route}",
        content=raw,
        headers={"Content-Type": "application/json"},
    )
    assert_error(response, 400, "BAD_REQUEST")


@pytest.mark.parametrize(
    "body",
    [
        {"agent": 5},
        {"agent": "nobody"},
        {"agent": "talker", "prompt": 3},
        {"agent": "talker", "session_id": 7},
        {"agent": "talker", "session_id": ""},
        {"agent": "talker", "session_id": "x" * 5000},
        ["talker"],
    ],
)
async def test_bad_creates_are_400(sqlite_api: Api, body: Any) -> None:
    response = await sqlite_api.http.post("/api/sessions", json=body)
    assert_error(response, 400, "BAD_REQUEST")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/sessions", {"limit": "0"}),
        ("/api/sessions", {"limit": "501"}),
        ("/api/sessions", {"limit": "ten"}),
        ("/api/sessions", {"status": "sleeping"}),
        ("/api/sessions", {"cursor": "not-a-cursor"}),
        ("{sid}/events", {"limit": "10001"}),
        ("{sid}/events", {"limit": "0"}),
        ("{sid}/events", {"limit": "-5"}),
        ("{sid}/events", {"after_seq": "first"}),
        ("{sid}/events", {"after_seq": "1.5"}),
        ("{sid}/stream", {"after_seq": "x"}),
    ],
)
async def test_bad_queries_are_400(
    sqlite_api: Api, idle_sid: str, path: str, params: dict[str, str]
) -> None:
    url = path.replace("{sid}", f"/api/sessions/{idle_sid}")
    response = await sqlite_api.http.get(url, params=params)
    assert_error(response, 400, "BAD_REQUEST")


async def test_oversized_bodies_are_413(servers: Servers, sqlite_api: Api, idle_sid: str) -> None:
    served = servers.get("sqlite")
    path = f"/api/sessions/{idle_sid}/messages"
    host = served.url.removeprefix("http://")
    huge = json.dumps({"text": "x" * 2_100_000}).encode()
    head = f"POST {path} HTTP/1.1\nHost: {host}\nContent-Type: application/json\n"
    response = await raw_request(served.url, head + f"Content-Length: {len(huge)}", huge)
    assert response.status == 413, response
    assert response.json()["error"]["code"] == "LIMIT_EXCEEDED"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server must count as it reads
        for piece in [b'{"text": "', *[b"y" * 100_000] * 25, b'"}']:
            yield b"%x\r\n%s\r\n" % (len(piece), piece)
        yield b"0\r\n\r\n"

    response = await raw_request(served.url, head + "Transfer-Encoding: chunked", chunks())
    assert response.status == 413, response
    assert response.json()["error"]["code"] == "LIMIT_EXCEEDED"
    # Under the body limit but over the fleet's message limit: refused as well, not queued.
    refused = await sqlite_api.http.post(path, json={"text": "z" * 1_500_000})
    assert_error(refused, 413, "LIMIT_EXCEEDED")
    # A message sent after them runs; none of them reached the log before it.
    marker = await sqlite_api.post(path, {"text": "after the big ones"})
    events = await sqlite_api.wait_events(
        idle_sid,
        lambda events: (
            ("next-turn", marker["message_id"]) in inserted(events) and ended_turns(1)(events)
        ),
        "the marker message",
    )
    assert "zzzz" not in json.dumps(events)
    assert "yyyy" not in json.dumps(events)


async def test_duplicate_session_id_is_409(sqlite_api: Api) -> None:
    sid = tag("dup")
    await sqlite_api.create("talker", session_id=sid)
    queued = await sqlite_api.http.post(
        "/api/sessions", json={"agent": "talker", "session_id": sid}
    )
    assert_error(queued, 409, "SESSION_ALREADY_EXISTS")  # still queued for the worker
    await sqlite_api.wait_session(sid, lambda d: d["status"] == "idle", "created")
    stored = await sqlite_api.http.post(
        "/api/sessions", json={"agent": "helper", "session_id": sid}
    )
    assert_error(stored, 409, "SESSION_ALREADY_EXISTS")
    assert (await sqlite_api.session(sid))["agent"] == "talker"


async def test_approving_a_call_that_does_not_wait_is_409(sqlite_api: Api, idle_sid: str) -> None:
    for decision in ("approve", "deny"):
        response = await sqlite_api.http.post(
            f"/api/sessions/{idle_sid}/approvals/call-nope", json={"decision": decision}
        )
        assert_error(response, 409, "NOT_AWAITING_APPROVAL")


async def test_store_failure_is_503(servers: Servers) -> None:
    """PostgreSQL's tables dropped under a running server: reads fail with STORE_FAILED."""
    served = servers.get("postgres", name="broken", worker=False)
    async with open_api(served) as api:
        sid = await api.create("talker", session_id=tag("doomed"))
        await api.get("/api/sessions", {"q": sid})
        dsn, _, query = served.store_url.partition("?")
        prefix = dict(part.split("=") for part in query.split("&"))["table_prefix"]
        await trio.to_thread.run_sync(drop_tables, dsn, prefix)
        for path in ("/api/sessions", f"/api/sessions/{sid}", f"/api/sessions/{sid}/events"):
            assert_error(await api.http.get(path), 503, "STORE_FAILED")


def drop_tables(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in PG_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {prefix}{table} CASCADE")
