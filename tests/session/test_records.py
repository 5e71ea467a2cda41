"""Event payload builders and the runtime's record cache (``_session/records.py``)."""

from __future__ import annotations

import attrs
import trio

from dsh_agent_loop import MemoryStore, Reply, ScriptedModel, open_runtime
from dsh_agent_loop._frozen import FrozenDict, thaw
from dsh_agent_loop._session.records import (
    PAYLOAD_RECORDS_MAX,
    SHARED_POSITIONS,
    STREAM_RECORDS_MAX,
    USAGE_RECORDS_MAX,
    RecordCache,
    abandoned_attempt_data,
    assistant_message_data,
    response_data,
    tool_call_data,
    tool_result_data,
)
from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.llm._base import Usage
from dsh_agent_loop.testing import actor_of

from ..agent.conftest import OPTIONS


def test_positions_are_shared_within_a_cache_and_bounded() -> None:
    cache = RecordCache()
    assert cache.step_data(1, 2) is cache.step_data(1, 2)
    assert cache.step_data(1, 2) == {"turn": 1, "step": 2}
    assert cache.turn_data(3) is cache.turn_data(3)
    assert cache.turn_data(3) == {"turn": 3}
    held = len(cache)
    big = SHARED_POSITIONS + 1
    assert cache.step_data(big, 1) == {"turn": big, "step": 1}
    assert cache.step_data(big, 1) is not cache.step_data(big, 1)  # not kept
    assert len(cache) == held


def test_stream_records_are_bounded() -> None:
    cache = RecordCache()
    first = cache.stream_record(1, "stop", None)
    assert first == {"attempt": 1, "finish": "stop"}
    assert cache.stream_record(1, "stop", None) is first
    assert cache.stream_record(2, "stop", "end_turn") == {
        "attempt": 2,
        "finish": "stop",
        "stop_reason": "end_turn",
    }
    for n in range(STREAM_RECORDS_MAX + 10):
        cache.stream_record(n, "tool-calls", None)
    assert len(cache) <= STREAM_RECORDS_MAX


def test_usage_records_are_shared_when_equal_and_bounded() -> None:
    cache = RecordCache()
    first = cache.usage_record(Usage(11, 1))
    assert first == {"input_tokens": 11, "output_tokens": 1}
    assert list(first) == ["input_tokens", "output_tokens"]
    assert cache.usage_record(Usage(11, 1)) is first
    assert cache.usage_record(Usage(12, 1)) is not first
    full = cache.usage_record(Usage(11, 1, cache_read_tokens=3, reasoning_tokens=0))
    assert full == Usage(11, 1, cache_read_tokens=3, reasoning_tokens=0).to_data()
    assert list(full) == list(Usage(11, 1, cache_read_tokens=3, reasoning_tokens=0).to_data())
    assert cache.usage_record(Usage(11, 1, cache_read_tokens=3, reasoning_tokens=0)) is full
    for n in range(USAGE_RECORDS_MAX + 10):
        cache.usage_record(Usage(n, 0))
    assert len(cache) <= USAGE_RECORDS_MAX + 3
    past = Usage(10**9, 0)
    assert cache.usage_record(past) == past.to_data()
    assert cache.usage_record(past) is not cache.usage_record(past)  # not kept


def test_tool_records_read_like_the_dicts_they_stand_for() -> None:
    block = FrozenDict(type="tool-call", call_id="c-1", name="noop", arguments='{"n":1}')
    call = tool_call_data(1, 2, block)
    assert call == {"turn": 1, "step": 2, "call_id": "c-1", "name": "noop", "arguments": '{"n":1}'}
    assert list(call) == ["turn", "step", "call_id", "name", "arguments"]
    result = tool_result_data(1, 2, block, "ok")
    assert thaw(result) == {
        "turn": 1,
        "step": 2,
        "message": {
            "role": "tool",
            "call_id": "c-1",
            "name": "noop",
            "content": [
                {
                    "type": "tool-result",
                    "call_id": "c-1",
                    "name": "noop",
                    "text": "ok",
                    "is_error": False,
                }
            ],
        },
    }
    failed = tool_result_data(1, 2, block, "boom", error=("ToolError", "TOOL_FAILED"), meta=7)
    assert list(failed) == ["turn", "step", "message", "error", "meta"]
    assert failed["error"] == {"name": "ToolError", "code": "TOOL_FAILED"}
    assert failed["message"]["content"][0]["is_error"] is True
    other = tool_result_data(1, 3, block, "ok")
    assert other._k is result._k  # records of one kind share their keys


def test_builders_keep_the_field_order_of_the_log() -> None:
    data = assistant_message_data(1, 2, (), RecordCache().stream_record(1, "stop", None))
    assert list(data) == ["turn", "step", "message", "stream"]
    failed = abandoned_attempt_data(1, 2, 3, "he", "", {"code": "X"})  # type: ignore[arg-type]
    assert list(failed) == ["turn", "step", "stream", "failure"]
    assert failed["stream"] == {"attempt": 3, "text": "he"}


async def _turn_records(store: MemoryStore) -> tuple[object, list[object]]:
    async with open_runtime(
        store=store, providers={"scripted": ScriptedModel([Reply.text("hi")])}
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        shared = [
            e.data for e in handle.agent.session.events if e.type in ("turn/start", "step/start")
        ]
        return actor_of(handle.agent).services.records, shared


async def test_each_runtime_owns_its_record_cache() -> None:
    cache_a, records_a = await _turn_records(MemoryStore())
    cache_b, records_b = await _turn_records(MemoryStore())
    assert isinstance(cache_a, RecordCache)
    assert cache_a is not cache_b
    assert records_a == records_b  # the same payloads ...
    assert all(a is not b for a, b in zip(records_a, records_b, strict=True))  # ... not shared
    await trio.lowlevel.checkpoint()


async def test_agents_of_one_runtime_share_their_runtime_cache() -> None:
    model = ScriptedModel([Reply.text("hi")], loop=True)
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        a = await rt.agents.create(options=OPTIONS)
        b = await rt.agents.create(options=attrs.evolve(OPTIONS, id="other"))
        for handle in (a, b):
            handle.agent.followup("go")
            await handle.agent.wait_idle()
        assert actor_of(a.agent).services.records is actor_of(b.agent).services.records
        starts = [
            next(e.data for e in h.agent.session.events if e.type == "turn/start") for h in (a, b)
        ]
        assert starts[0] is starts[1]


def test_the_response_field_keeps_what_the_provider_reported() -> None:
    assert response_data(None, None) is None
    assert response_data("gpt-4o", None) == {"model": "gpt-4o"}
    assert response_data(None, "msg_1") == {"id": "msg_1"}
    stream = RecordCache().stream_record(1, "stop", None)
    response = response_data("gpt-4o", "chatcmpl-1")
    assert response == {"model": "gpt-4o", "id": "chatcmpl-1"}
    data = assistant_message_data(1, 2, (), stream, None, response)
    assert list(data) == ["turn", "step", "message", "stream", "response"]
    usage = {"input_tokens": 1, "output_tokens": 2}
    data = assistant_message_data(1, 2, (), stream, usage, response)
    assert list(data) == ["turn", "step", "message", "stream", "usage", "response"]
    assert data["response"] is response


def test_payloads_of_the_shared_types_are_one_object_when_their_json_is_equal() -> None:
    cache = RecordCache()
    first = cache.payload("turn/end", FrozenDict(turn=1, reason=FrozenDict(kind="completed")))
    again = FrozenDict(turn=1, reason=FrozenDict(kind="completed"))
    assert again is not first
    assert cache.payload("turn/end", again) is first
    other_turn = FrozenDict(turn=2, reason=FrozenDict(kind="completed"))
    assert cache.payload("turn/end", other_turn) is other_turn
    for event_type in ("request/header", "request/context", "system/message"):
        built = [FrozenDict(kind=event_type, config=FrozenDict(model="m")) for _ in range(2)]
        assert cache.payload(event_type, built[0]) is built[0]
        assert cache.payload(event_type, built[1]) is built[0]


def test_equal_payloads_with_other_json_are_not_shared() -> None:
    """``1``, ``1.0`` and ``true`` are equal in Python; a log must keep what was written."""
    cache = RecordCache()
    written = [
        FrozenDict(provider="p", model="m", context_window=value) for value in (1, 1.0, True)
    ]
    written.append(FrozenDict(model="m", provider="p", context_window=1))  # key order
    assert all(data == written[0] for data in written)  # all equal as mappings
    kept = [cache.payload("request/context", data) for data in written]
    assert all(k is w for k, w in zip(kept, written, strict=True))
    assert [type(k["context_window"]) for k in kept] == [int, float, bool, int]
    assert [list(k) for k in kept][-1] == ["model", "provider", "context_window"]


def test_other_payloads_and_inserting_splices_are_not_shared() -> None:
    cache = RecordCache()
    message = FrozenDict(message=FrozenDict(role="user", content=()))
    for _ in range(2):
        fresh = FrozenDict(message=FrozenDict(role="user", content=()))
        assert cache.payload("user/message", fresh) is fresh
    inserting = [
        FrozenDict(target="next-turn", start=0, removed_count=0, inserted=(message,))
        for _ in range(2)
    ]
    assert cache.payload("agent/inbox/spliced", inserting[1]) is inserting[1]
    assert cache.payload("agent/inbox/spliced", inserting[0]) is inserting[0]
    claiming = [
        FrozenDict(target="next-turn", start=0, removed_count=1, inserted=()) for _ in range(2)
    ]
    assert cache.payload("agent/inbox/spliced", claiming[0]) is claiming[0]
    assert cache.payload("agent/inbox/spliced", claiming[1]) is claiming[0]
    assert len(cache) == 1


def test_shared_payloads_are_bounded() -> None:
    cache = RecordCache()
    for turn in range(PAYLOAD_RECORDS_MAX + 10):
        cache.payload("turn/end", FrozenDict(turn=turn, reason=FrozenDict(kind="completed")))
    assert len(cache) <= PAYLOAD_RECORDS_MAX
    first = cache.payload("turn/end", FrozenDict(turn=-1, reason=FrozenDict(kind="aborted")))
    again = FrozenDict(turn=-1, reason=FrozenDict(kind="aborted"))
    assert cache.payload("turn/end", again) is first  # still shared after starting over


async def test_agents_of_one_runtime_write_alike_payloads_once_and_store_them_as_built() -> None:
    shared_types = ("turn/end", "request/header", "request/context", "agent/inbox/spliced")
    model = ScriptedModel([Reply.text("hi")], loop=True)
    store = MemoryStore()
    async with open_runtime(store=store, providers={"scripted": model}) as rt:
        a = await rt.agents.create(options=OPTIONS)
        b = await rt.agents.create(options=attrs.evolve(OPTIONS, id="other"))
        for handle in (a, b):
            handle.agent.followup("go")
            await handle.agent.wait_idle()
        logs = [h.agent.session.events for h in (a, b)]
        ids = [h.session_id for h in (a, b)]
    for event_type in shared_types:
        data = [[e.data for e in log if e.type == event_type][-1] for log in logs]
        assert data[0] is data[1], event_type
    inserts = [next(e.data for e in log if e.type == "agent/inbox/spliced") for log in logs]
    assert inserts[0] is not inserts[1]  # each inserts its own message
    for session_id, log in zip(ids, logs, strict=True):
        reader = await store.open(session_id)
        stored = await reader.read()
        await reader.close()
        assert [event_to_json(e) for e in stored] == [event_to_json(e) for e in log]
        assert [thaw(e.data) for e in log if e.type == "turn/end"] == [
            {"turn": 1, "reason": {"kind": "completed"}}
        ]


def test_payloads_holding_null_are_not_shared() -> None:
    """The key writes None, NaN and the infinities alike (``null``); the log does not."""
    cache = RecordCache()
    nan = FrozenDict(provider="p", model="m", temperature=float("nan"))
    none = FrozenDict(provider="p", model="m", temperature=None)
    assert cache.payload("request/context", nan) is nan
    assert cache.payload("request/context", none) is none
    again = FrozenDict(provider="p", model="m", temperature=None)
    assert cache.payload("request/context", again) is again
    assert len(cache) == 0
