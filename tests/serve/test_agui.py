"""``POST /agui``: reading a ``RunAgentInput``, the SSE stream, and the endpoint end to end.

The end-to-end tests POST to a real ``dsh-agent serve`` with a real worker (``conftest.py``,
one server and worker for the module) over loopback HTTP and read the SSE stream, every event
held to the protocol's own models and to the conformance validator (``agui_checks``). The
translation itself is ``test_agui_translate.py`` (docs/design.md#ag-ui).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from ag_ui_validate.pytest_plugin import assert_valid_agui_endpoint

from dsh_agent_loop import Event, Reply, StoreError
from dsh_agent_loop._serve.agui import KEEPALIVE, Decision, agui_stream, parse_request
from dsh_agent_loop._serve.agui_translate import RunTranslator, agui_message_id
from dsh_agent_loop._serve.replies import ApiError

from .agui_checks import (
    FULL_RUN,
    THREAD,
    check_run,
    conformant,
    parse,
    session_log,
    sse_payloads,
    types,
)
from .conftest import Served

# --- reading the input ---------------------------------------------------------------------


def test_parse_request_reads_the_last_user_messages_text() -> None:
    body = {
        "threadId": "t-1",
        "runId": "r-1",
        "messages": [
            {"id": "1", "role": "user", "content": "old"},
            {"id": "2", "role": "assistant", "content": "hi"},
            {"id": "3", "role": "user", "content": [{"type": "text", "text": "a"},
             {"type": "image", "source": {"type": "url", "value": "http://x/y.png"}},
             {"type": "text", "text": "b"}]},
            {"id": "4", "role": "tool", "content": "r", "toolCallId": "c"},
        ],
        "forwardedProps": {"agent": "talker"},
    }  # fmt: skip
    run = parse_request(json.dumps(body).encode())
    assert (run.thread_id, run.run_id, run.text, run.agent) == ("t-1", "r-1", "a\nb", "talker")
    body["messages"] = [{"id": "1", "role": "assistant", "content": "hi"}]
    body["forwardedProps"] = {"agent": 3}
    run = parse_request(json.dumps(body).encode())
    assert (run.text, run.agent) == (None, None)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'{"threadId": "t", "messages": []}', "runId"),
        (b'{"threadId": "t", "runId": "r", "messages": [{"role": "user"}]}', "messages"),
        (b'{"threadId": "", "runId": "r", "messages": []}', "threadId"),
        (json.dumps({"threadId": "t", "runId": "r" * 196, "messages": []}).encode(), "runId"),
    ],
)
def test_parse_request_refuses_bad_bodies(raw: bytes, needle: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_request(raw)
    assert (caught.value.status, caught.value.code) == (400, "BAD_REQUEST")
    assert needle in caught.value.message


def resume_body(*entries: dict[str, Any], messages: Sequence[Any] = ()) -> bytes:
    payload = {"threadId": "t", "runId": "r", "messages": list(messages), "resume": list(entries)}
    return json.dumps(payload).encode()


def test_parse_request_reads_resume_entries_as_decisions() -> None:
    entries: list[dict[str, Any]] = [
        {"interruptId": "c1", "status": "resolved", "payload": True},
        {"interruptId": "c2", "status": "resolved", "payload": {"approved": True, "always": True}},
        {"interruptId": "c3", "status": "resolved", "payload": {"decision": "approve"}},
        {"interruptId": "c4", "status": "resolved", "payload": False},
        {
            "interruptId": "c5",
            "status": "resolved",
            "payload": {"approved": False, "message": "no"},
        },
        {
            "interruptId": "c6",
            "status": "resolved",
            "payload": {"decision": "deny", "message": "x"},
        },
        {"interruptId": "c7", "status": "cancelled"},
        {"interruptId": "c8", "status": "cancelled", "payload": {"approved": True, "message": "m"}},
    ]
    history = [
        {"id": "u1", "role": "user", "content": "write it"},
        {"id": "a1", "role": "assistant", "toolCalls": [{"id": "c1", "type": "function",
         "function": {"name": "write_file", "arguments": "{}"}}]},
    ]  # fmt: skip
    run = parse_request(resume_body(*entries, messages=history))
    assert run.resume == (
        Decision("c1", True),
        Decision("c2", True, always=True),
        Decision("c3", True),
        Decision("c4", False),
        Decision("c5", False, "no"),
        Decision("c6", False, "x"),
        Decision("c7", False),
        Decision("c8", False, "m"),  # cancelled denies, whatever the payload says
    )
    assert run.text is None  # the thread's messages so far: nothing new to send
    # a user message after them is a new message (the endpoint refuses it with a resume)
    more = [*history, {"id": "u2", "role": "user", "content": "and more"}]
    assert parse_request(resume_body(*entries[:1], messages=more)).text == "and more"
    # without entries the input is an ordinary run: the last user message anywhere is sent
    plain = json.loads(resume_body(messages=history))
    plain.update(resume=[], parentRunId="r0")
    run = parse_request(json.dumps(plain).encode())
    assert (run.resume, run.text, run.parent_run_id) == ((), "write it", "r0")


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ([{"interruptId": "c", "status": "resolved"}], "payload must approve"),
        ([{"interruptId": "c", "status": "resolved", "payload": "yes"}], "payload must approve"),
        ([{"interruptId": "c", "status": "resolved", "payload": 1}], "payload must approve"),
        ([{"interruptId": "c", "status": "resolved", "payload": {}}], "payload must approve"),
        ([{"interruptId": "c", "status": "resolved", "payload": {"approved": "yes"}}], "approved"),
        ([{"interruptId": "c", "status": "resolved", "payload": {"decision": "ok"}}], "decision"),
        ([{"interruptId": "c", "status": "resolved",
           "payload": {"approved": True, "decision": "deny"}}], "says both"),
        ([{"interruptId": "c", "status": "cancelled", "payload": {"message": 3}}], "message"),
        ([{"interruptId": "c", "status": "resolved", "payload": {"approved": True,
           "always": "yes"}}], "always"),
        ([{"interruptId": "c", "status": "later"}], "resume.0.status"),
        ([{"interruptId": "c", "status": "cancelled"}] * 2, "more than once: ['c']"),
        ([{"interruptId": f"c{i}", "status": "cancelled"} for i in range(1001)], "over 1000"),
    ],
)  # fmt: skip
def test_parse_request_refuses_bad_resume_entries(entries: list[Any], needle: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_request(resume_body(*entries))
    assert (caught.value.status, caught.value.code) == (400, "BAD_REQUEST")
    assert needle in caught.value.message


def test_a_denial_the_fleet_would_refuse_is_refused_before_anything() -> None:
    entry = {"interruptId": "c", "status": "cancelled", "payload": {"message": '"' * 600_000}}
    with pytest.raises(ApiError) as caught:
        parse_request(resume_body(entry))
    assert (caught.value.status, caught.value.code) == (413, "LIMIT_EXCEEDED")
    assert "resume[0]'s message" in caught.value.message


# --- the stream -----------------------------------------------------------------------------


class Tail:
    """A fake ``client.events`` tail: events arrive through a channel; raises ``failure``."""

    def __init__(self, recv: trio.MemoryReceiveChannel[Event | Exception]) -> None:
        self.recv = recv

    def __aiter__(self) -> Tail:
        return self

    async def __anext__(self) -> Event:
        item = await self.recv.receive()
        if isinstance(item, Exception):
            raise item
        return item


async def collect(stream: AsyncIterator[str]) -> list[tuple[float, str]]:
    async with aclosing(stream) as frames:  # type: ignore[type-var]
        return [(trio.current_time(), frame) async for frame in frames]


async def test_the_stream_keeps_alive_while_quiet_and_ends_with_the_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # no tool: a tool's thread would let the virtual clock jump while it runs
    log = await session_log(tmp_path, [Reply.text("ok", reasoning="hmm")], ["r1"])
    send, recv = trio.open_memory_channel[Event | Exception](100)
    translator = RunTranslator(THREAD, "r1", agui_message_id("r1"))
    start = trio.current_time()

    async def feed() -> None:
        await trio.sleep(2 * KEEPALIVE + 1)  # nobody runs the turn for a while
        for event in log:
            await send.send(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        frames = await collect(agui_stream(translator.start(), translator, Tail(recv)))
    keepalives = [at - start for at, frame in frames if frame == ": keepalive\n\n"]
    assert keepalives == pytest.approx([KEEPALIVE, 2 * KEEPALIVE])
    payloads, comments = sse_payloads("".join(frame for _, frame in frames))
    assert comments == 2
    run = [parse(p) for p in payloads]
    assert types(run) == [FULL_RUN[i] for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -2, -1)]
    conformant(run)
    assert frames[-1][0] - start == pytest.approx(2 * KEEPALIVE + 1)  # ended with the turn


async def test_a_store_failure_while_following_ends_the_run_with_its_code(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, recv = trio.open_memory_channel[Event | Exception](10)
    send.send_nowait(StoreError("disk on fire"))
    translator = RunTranslator(THREAD, "r1", agui_message_id("r1"))
    frames = await collect(agui_stream(translator.start(), translator, Tail(recv)))
    run = [parse(p) for p in sse_payloads("".join(f for _, f in frames))[0]]
    assert types(run) == ["RUN_STARTED", "RUN_ERROR"]
    assert (run[-1]["code"], run[-1]["message"]) == ("STORE_FAILED", "disk on fire")
    conformant(run)


# --- end to end: a real server and worker ------------------------------------------------------

HELPER_TEXTS = ["Let me look.", "done looking"]


def body(thread: str, run: str, *messages: dict[str, Any], agent: str | None = None) -> Any:
    """A ``RunAgentInput``; ``messages`` default to one user message ``hello``."""
    shown = list(messages) or [{"id": "u1", "role": "user", "content": "hello"}]
    payload: dict[str, Any] = {"threadId": thread, "runId": run, "messages": shown}
    payload.update(state={}, tools=[], context=[], forwardedProps={})
    if agent is not None:
        payload["forwardedProps"] = {"agent": agent}
    return payload


def new_thread() -> str:
    return f"agui-thread-{secrets.token_hex(4)}"


def post_run(served: Served, payload: Any) -> list[dict[str, Any]]:
    """POST ``/agui`` and read the whole SSE stream; every event parsed by the protocol."""
    with served.client() as http, http.stream("POST", "/agui", json=payload) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        text = "".join(reply.iter_text())
    payloads, _ = sse_payloads(text)
    run = [parse(p) for p in payloads]
    check_run(run, payload["threadId"], payload["runId"])
    conformant(run)
    return run


def without_times(run: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "timestamp"} for e in run]


def test_a_new_thread_is_created_and_its_turn_streamed(shared_served: Served) -> None:
    thread = new_thread()
    run = post_run(shared_served, body(thread, "run-1", agent="helper"))
    assert types(run) == FULL_RUN
    texts = [e["delta"] for e in run if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert texts == HELPER_TEXTS
    (reasoning,) = [e["delta"] for e in run if e["type"] == "REASONING_MESSAGE_CONTENT"]
    assert reasoning == "I should look at the folder first."
    (call,) = [e for e in run if e["type"] == "TOOL_CALL_START"]
    (result,) = [e for e in run if e["type"] == "TOOL_CALL_RESULT"]
    assert call["toolCallName"] == "list_dir"
    assert result["toolCallId"] == call["toolCallId"]
    assert "serve.yaml" in result["content"].split("\n")  # the worker's cwd, listed
    assert run[-1]["outcome"] == {"type": "success"}
    summary = shared_served.summary(thread)
    assert (summary["agent"], summary["turns"]) == ("helper", 1)

    # the same run again: the same message (nothing sent), the same turn replayed
    again = post_run(shared_served, body(thread, "run-1", agent="helper"))
    assert without_times(again[1:]) == without_times(run[1:])
    assert again[1:] == run[1:]  # stamped with the log's times
    with shared_served.client() as http:
        log = http.get(f"/api/sessions/{thread}/events").json()["events"]
    sent = [
        m["id"] for e in log if e["type"] == "agent/inbox/spliced" for m in e["data"]["inserted"]
    ]
    assert sent == [agui_message_id("run-1")]

    # a next run on the thread streams its own turn only
    second = post_run(shared_served, body(thread, "run-2", {"id": "u2", "role": "user",
                      "content": [{"type": "text", "text": "again"}]}))  # fmt: skip
    assert types(second) == FULL_RUN
    first_ids = {e.get("messageId") for e in run} - {None}
    assert first_ids.isdisjoint({e.get("messageId") for e in second})
    assert shared_served.summary(thread)["turns"] == 2


def test_bad_input_is_refused_and_nothing_is_created(shared_served: Served) -> None:
    thread = new_thread()
    with shared_served.client() as http:
        for raw in (b"{oops", b'"text"', json.dumps({"threadId": thread}).encode()):
            reply = http.post("/agui", content=raw, headers={"content-type": "application/json"})
            assert reply.status_code == 400, reply.text
            assert reply.json()["error"]["code"] == "BAD_REQUEST"
        reply = http.post("/agui", json=body(thread, "r", agent="no-such-agent"))
        assert (reply.status_code, reply.json()["error"]["code"]) == (400, "BAD_REQUEST")
        assert "no-such-agent" in reply.json()["error"]["message"]
        # under the body's cap, over the fleet's for one message (escaped quotes double it)
        big = body(thread, "r", {"id": "u", "role": "user", "content": '"' * 600_000})
        reply = http.post("/agui", json=big)
        assert (reply.status_code, reply.json()["error"]["code"]) == (413, "LIMIT_EXCEEDED")
    no_user = body(thread, "r", {"id": "a", "role": "assistant", "content": "hi"})
    run = post_run(shared_served, no_user)
    assert types(run) == ["RUN_STARTED", "RUN_ERROR"]
    assert run[-1]["code"] == "NO_USER_MESSAGE"
    with shared_served.client() as http:
        missing = http.get(f"/api/sessions/{thread}")
    assert missing.status_code == 404  # nothing was created for any of these


CONTINUATION = [
    "RUN_STARTED",
    "STEP_STARTED",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "STEP_FINISHED",
    "RUN_FINISHED",
]


def interrupted(served: Served) -> tuple[str, str, list[dict[str, Any]]]:
    """A ``guarded`` thread whose first run stopped for approval: thread, call id, messages.

    The messages are the thread's so far, as a client resuming it sends them.
    """
    thread = new_thread()
    run = post_run(served, body(thread, "r1", agent="guarded"))
    (call,) = [e for e in run if e["type"] == "TOOL_CALL_START"]
    (args,) = [e["delta"] for e in run if e["type"] == "TOOL_CALL_ARGS"]
    assert call["toolCallName"] == "write_file"
    outcome = run[-1]["outcome"]
    assert outcome["type"] == "interrupt"
    assert [(i["id"], i["toolCallId"]) for i in outcome["interrupts"]] == [
        (call["toolCallId"], call["toolCallId"])
    ]
    function = {"name": "write_file", "arguments": args}
    history: list[dict[str, Any]] = [
        {"id": "u1", "role": "user", "content": "hello"},
        {"id": "a1", "role": "assistant",
         "toolCalls": [{"id": call["toolCallId"], "type": "function", "function": function}]},
    ]  # fmt: skip
    return thread, str(call["toolCallId"]), history


def resuming(
    thread: str, run: str, history: Sequence[Any], *entries: dict[str, Any]
) -> dict[str, Any]:
    """A resuming ``RunAgentInput``: the thread's messages and the answers."""
    payload = body(thread, run, *history)
    payload.update(resume=list(entries), parentRunId="r1")
    return dict(payload)


def log_of(served: Served, thread: str) -> list[dict[str, Any]]:
    with served.client() as http:
        return list(http.get(f"/api/sessions/{thread}/events").json()["events"])


def test_an_approved_interrupt_resumes_with_its_continuation(shared_served: Served) -> None:
    thread, call_id, history = interrupted(shared_served)
    before = shared_served.summary(thread)
    assert (before["status"], before["pending_approvals"]) == ("awaiting-approval", 1)
    # a next run would wait behind the call: it is interrupted at once and sends nothing
    refused = post_run(shared_served, body(thread, "r2"))
    assert types(refused) == ["RUN_STARTED", "RUN_FINISHED"]
    assert [i["id"] for i in refused[-1]["outcome"]["interrupts"]] == [call_id]
    # a bad interrupt id, or a new user message with the answers: nothing is decided
    deny = {"interruptId": call_id, "status": "cancelled"}
    wrong = {"interruptId": "no-such-call", "status": "resolved", "payload": True}
    bad = post_run(shared_served, resuming(thread, "r3", history, deny, wrong))
    assert types(bad) == ["RUN_STARTED", "RUN_ERROR"]
    assert bad[-1]["code"] == "NOT_AWAITING_APPROVAL"
    assert "no-such-call" in bad[-1]["message"]
    assert call_id not in bad[-1]["message"].split("(")[0]  # only the bad one is named
    new_message = {"id": "u2", "role": "user", "content": "and then?"}
    talk = post_run(shared_served, resuming(thread, "r4", [*history, new_message], deny))
    assert (types(talk), talk[-1]["code"]) == (["RUN_STARTED", "RUN_ERROR"], "RESUME_WITH_MESSAGE")
    assert shared_served.summary(thread)["events"] == before["events"]

    written = shared_served.cwd / "out.txt"
    written.unlink(missing_ok=True)
    approve = {"interruptId": call_id, "status": "resolved", "payload": {"approved": True}}
    run = post_run(shared_served, resuming(thread, "r5", history, approve))
    assert types(run) == CONTINUATION
    assert run[0]["parentRunId"] == "r1"
    (start,) = [e for e in run if e["type"] == "TOOL_CALL_START"]
    (args,) = [e for e in run if e["type"] == "TOOL_CALL_ARGS"]
    (result,) = [e for e in run if e["type"] == "TOOL_CALL_RESULT"]
    assert (start["toolCallId"], start["toolCallName"]) == (call_id, "write_file")
    assert json.loads(args["delta"]) == {"path": "out.txt", "content": "hi"}
    assert result["toolCallId"] == call_id
    assert not result["content"].startswith("Error")  # the cancelled entry above decided nothing
    assert written.read_text() == "hi"
    assert [e["delta"] for e in run if e["type"] == "TEXT_MESSAGE_CONTENT"] == ["finished"]
    assert run[-1]["outcome"] == {"type": "success"}
    after = shared_served.summary(thread)
    assert (after["pending_approvals"], after["turns"]) == (0, 2)
    # the same resume again: its call no longer waits
    again = post_run(shared_served, resuming(thread, "r5", history, approve))
    assert (types(again), again[-1]["code"]) == (
        ["RUN_STARTED", "RUN_ERROR"],
        "NOT_AWAITING_APPROVAL",
    )
    assert "waiting: none" in again[-1]["message"]


def test_a_cancelled_interrupt_denies_its_call_and_the_agent_goes_on(
    shared_served: Served,
) -> None:
    thread, call_id, history = interrupted(shared_served)
    written = shared_served.cwd / "out.txt"
    written.unlink(missing_ok=True)
    cancel = {"interruptId": call_id, "status": "cancelled"}
    run = post_run(shared_served, resuming(thread, "r2", history, cancel))
    assert types(run) == CONTINUATION
    (result,) = [e for e in run if e["type"] == "TOOL_CALL_RESULT"]
    assert (result["toolCallId"], result["content"]) == (call_id, "Error: tool call denied")
    assert [e["delta"] for e in run if e["type"] == "TEXT_MESSAGE_CONTENT"] == ["finished"]
    assert run[-1]["outcome"] == {"type": "success"}
    assert not written.exists()
    (logged,) = [e for e in log_of(shared_served, thread) if e["type"] == "tool/result"]
    assert logged["data"]["error"]["code"] == "DENIED"
    (decision,) = [e for e in log_of(shared_served, thread) if e["type"] == "tool/approval"]
    assert decision["data"]["decision"] == "deny"


def test_a_cancelled_turn_finishes_cancelled_and_a_disconnect_stops_nothing(
    shared_served: Served,
) -> None:
    thread = new_thread()
    payload = body(thread, "r1", agent="slow")
    with shared_served.client() as http, http.stream("POST", "/agui", json=payload) as reply:
        lines = reply.iter_lines()
        while "STEP_STARTED" not in next(lines):
            pass
    # the client went away mid-turn: the turn goes on in the worker
    assert shared_served.wait_status(thread, "running")["turns"] == 1
    with shared_served.client() as http, http.stream("POST", "/agui", json=payload) as reply:
        chunks = reply.iter_text()
        text = ""
        while "STEP_STARTED" not in text:
            text += next(chunks)
        cancel = http.post(f"/api/sessions/{thread}/cancel", json={})
        assert cancel.status_code == 202, cancel.text
        text += "".join(chunks)
    run = [parse(p) for p in sse_payloads(text)[0]]
    check_run(run, thread, "r1")
    conformant(run)
    assert run[-1]["type"] == "RUN_FINISHED"
    assert run[-1]["outcome"] == {"type": "cancelled"}


async def test_the_endpoint_passes_the_conformance_validator(served_any: Served) -> None:
    """On SQLite and on PostgreSQL, validated as it streams (framing, Content-Type, order)."""
    headers = {} if served_any.token is None else {"authorization": f"Bearer {served_any.token}"}
    await assert_valid_agui_endpoint(
        f"{served_any.url}/agui",
        input=body(new_thread(), "r1", agent="helper"),
        headers=headers,
        timeout_ms=60_000,
        max_warnings=0,
    )
