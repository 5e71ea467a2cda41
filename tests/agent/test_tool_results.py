"""What a tool hands back (docs/design.md#results-order): bad results are a call's error.

A result the log cannot hold (non-JSON ``meta``, non-str content, ...) becomes that call's
``TOOL_ERROR``; text with surrogate code points is escaped so every store can encode it; an
exception whose ``str()`` fails is still ``TOOL_ERROR``. Tool-pipeline hooks that raise end the
turn ``error`` (docs/design.md#where-failures-go); none of it stops another agent or the runtime.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    JsonlStore,
    MemoryStore,
    Reply,
    ScriptedModel,
    Tool,
    ToolResult,
    open_runtime,
    tool,
)
from dsh_agent_loop._tools.base import MAX_ECHO

from .conftest import assert_well_formed, harness, of_type, plain, turn_ends, user_texts


def _cycle() -> dict[str, Any]:
    meta: dict[str, Any] = {"a": [1]}
    meta["a"].append(meta)
    return meta


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class _Color(enum.IntEnum):
    RED = 1


# case -> (what the handler returns, words the TOOL_ERROR text must contain)
INVALID: dict[str, tuple[Any, tuple[str, ...]]] = {
    "meta-set": (ToolResult("x", meta={"tags": {1, 2}}), ("meta['tags']", "set")),
    "meta-object": (ToolResult("x", meta={"o": object()}), ("meta['o']", "object")),
    "meta-nan": (ToolResult("x", meta={"v": float("nan")}), ("meta['v']", "nan")),
    "meta-inf": (ToolResult("x", meta={"v": [0.5, float("-inf")]}), ("meta['v'][1]", "-inf")),
    "meta-cycle": (ToolResult("x", meta=_cycle()), ("meta['a'][1]", "cycle")),
    "meta-key": (ToolResult("x", meta={1: "a"}), ("meta", "int key")),
    "meta-list": (ToolResult("x", meta=["a"]), ("meta is list", "mapping")),
    "meta-bytes": (ToolResult("x", meta={"b": b"raw"}), ("meta['b']", "bytes")),
    "content-bytes": (ToolResult(b"raw"), ("content is bytes",)),  # type: ignore[arg-type]
    "content-none": (ToolResult(None), ("content is NoneType",)),  # type: ignore[arg-type]
    "content-object": (ToolResult(_Unprintable()), ("content is _Unprintable",)),  # type: ignore[arg-type]
    "contexts": (ToolResult("x", additional_contexts=["ok", 3]), ("additional_contexts[1]", "int")),  # type: ignore[list-item]
    "concludes": (ToolResult("x", concludes_turn="yes"), ("concludes_turn is str",)),  # type: ignore[arg-type]
    "error-code": (ToolResult("x", error=5), ("error is int",)),  # type: ignore[arg-type]
    "bytes": (b"raw", ("returned bytes",)),
    "none": (None, ("returned NoneType",)),
    "object": (_Unprintable(), ("returned _Unprintable",)),
    "dict": ({"a": 1}, ("returned dict",)),
}


def _returning(values: dict[str, Any]) -> Tool:
    async def handler(arguments: Any, context: Any) -> Any:
        return values[arguments["case"]]

    return Tool(
        name="give",
        description="returns what the test says",
        parameters={"type": "object", "properties": {"case": {"type": "string"}}},
        handler=handler,
    )


def _texts(events: list[Any]) -> dict[str, str]:
    return {
        e.data["message"]["call_id"]: e.data["message"]["content"][0]["text"]
        for e in of_type(events, "tool/result")
    }


def _errors(events: list[Any]) -> dict[str, Any]:
    return {
        e.data["message"]["call_id"]: plain(e.data.get("error"))
        for e in of_type(events, "tool/result")
    }


@pytest.mark.parametrize("middleware", [False, True], ids=["direct", "middleware"])
async def test_invalid_results_are_tool_errors_and_the_batch_goes_on(autojump_clock, middleware):
    values = {name: value for name, (value, _) in INVALID.items()}
    values["good"] = "fine"
    values["good-result"] = ToolResult("also fine", meta={"n": [1, 2.5, None, True]})
    names = ["good", *INVALID, "good-result"]
    calls = [("give", {"case": name}, name) for name in names]
    async with harness(
        [Reply.tool_calls(*calls), Reply.text("done")], tools=[_returning(values)]
    ) as h:
        if middleware:  # the result then passes through tools/execute and tools/post-execute

            async def through(payload: Any, next: Any) -> Any:
                return await next(payload)

            h.rt.hooks.waterfall("tools/execute", through)
            h.rt.hooks.waterfall("tools/post-execute", through)
        await h.run()
        events = h.events
        stored = await h.stored()
    errors, texts = _errors(events), _texts(events)
    assert list(errors) == names  # every call answered, in model order
    assert errors["good"] is None
    assert errors["good-result"] is None
    assert texts["good"] == "fine"
    (good,) = [
        e for e in of_type(events, "tool/result") if e.data["message"]["call_id"] == "good-result"
    ]
    assert plain(good.data["meta"]) == {"n": [1, 2.5, None, True]}
    for name, (_, words) in INVALID.items():
        assert errors[name] == {"name": "InvalidToolResult", "code": "TOOL_ERROR"}, name
        assert texts[name].startswith("Error: InvalidToolResult: "), texts[name]
        for word in words:
            assert word in texts[name], (name, texts[name])
    assert turn_ends(events) == [{"kind": "completed"}]
    # the model reads every result in the next request, and the store holds the same log
    tool_messages = [m for m in h.model.requests[1].messages if m["role"] == "tool"]
    assert [m["call_id"] for m in tool_messages] == names
    assert [e.data for e in stored] == [e.data for e in events]
    assert_well_formed(events)


async def test_a_single_invalid_result_is_a_tool_error_without_a_pool(autojump_clock):
    # One call takes the batch's short path (no nursery): the same rule applies there.
    values = {"bad": ToolResult("x", meta={"when": trio})}
    async with harness(
        [Reply.tool_calls(("give", {"case": "bad"}, "c1")), Reply.text("done")],
        tools=[_returning(values)],
    ) as h:
        await h.run()
        events = h.events
    assert _errors(events) == {"c1": {"name": "InvalidToolResult", "code": "TOOL_ERROR"}}
    assert "meta['when'] holds a module" in _texts(events)["c1"]
    assert turn_ends(events) == [{"kind": "completed"}]
    assert_well_formed(events)


async def test_the_error_text_of_an_invalid_result_is_bounded(autojump_clock):
    values = {"big": ToolResult("x", meta={"k" * (3 * MAX_ECHO): {1}})}
    async with harness(
        [Reply.tool_calls(("give", {"case": "big"}, "c1")), Reply.text("done")],
        tools=[_returning(values)],
    ) as h:
        await h.run()
        text = _texts(h.events)["c1"]
        assert_well_formed(h.events)
    assert text.startswith("Error: InvalidToolResult: meta[")
    assert len(text) == MAX_ECHO + 1  # cut, with an ellipsis


SURROGATE_CONTENT = "before \ud800 after \udfff"


@pytest.mark.parametrize("store_kind", ["memory", "jsonl"])
async def test_surrogates_are_escaped_so_every_store_can_encode_them(tmp_path, store_kind):
    # No autojump clock: the JSONL store works in threads, and nothing here sleeps.
    values = {
        "text": SURROGATE_CONTENT,
        "result": ToolResult(
            "r \udc80",
            error="CODE\ud801",
            additional_contexts=["context \ud83d"],
            meta={"key \ud800": ["value \udfff", "ok"]},
        ),
    }

    class Bad(Exception):
        pass

    async def raising(arguments: Any, context: Any) -> str:
        raise Bad("lone \ud800 in a message")

    boom = Tool(name="boom", description="raises", parameters={}, handler=raising)
    store = MemoryStore() if store_kind == "memory" else JsonlStore(tmp_path)
    calls = [
        ("give", {"case": "text"}, "t1"),
        ("give", {"case": "result"}, "r1"),
        ("boom", {}, "b1"),
    ]
    async with harness(
        [Reply.tool_calls(*calls), Reply.text("done")],
        tools=[_returning(values), boom],
        store=store,
    ) as h:
        await h.run()
        events = h.events
        stored = await h.stored()
    texts = _texts(events)
    assert texts["t1"] == "before \\ud800 after \\udfff"
    assert texts["r1"] == "r \\udc80"
    assert texts["b1"] == "Error: Bad: lone \\ud800 in a message"
    errors = _errors(events)
    assert errors["t1"] is None
    assert errors["r1"] == {"name": "CODE\\ud801", "code": "CODE\\ud801"}
    assert errors["b1"] == {"name": "Bad", "code": "TOOL_ERROR"}
    (result,) = [e for e in of_type(events, "tool/result") if e.data["message"]["call_id"] == "r1"]
    assert plain(result.data["meta"]) == {"key \\ud800": ["value \\udfff", "ok"]}
    # the additional context reached the next step, escaped too
    assert "context \\ud83d" in user_texts(h.model.requests[1].messages)
    assert turn_ends(events) == [{"kind": "completed"}]
    assert [e.data for e in stored] == [e.data for e in events]
    assert_well_formed(stored)


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str failed")


class _StrNotText(Exception):
    def __str__(self) -> Any:
        return 42


@pytest.mark.parametrize("middleware", [False, True], ids=["direct", "middleware"])
async def test_an_exception_whose_str_fails_is_still_a_tool_error(autojump_clock, middleware):
    async def raise_it(arguments: Any, context: Any) -> str:
        raise {"raises": _StrRaises, "not-text": _StrNotText}[arguments["case"]]()

    bad = Tool(
        name="bad",
        description="raises unprintable exceptions",
        parameters={"type": "object", "properties": {"case": {"type": "string"}}},
        handler=raise_it,
    )
    calls = [("bad", {"case": "raises"}, "c1"), ("bad", {"case": "not-text"}, "c2")]
    async with harness([Reply.tool_calls(*calls), Reply.text("done")], tools=[bad]) as h:
        if middleware:

            async def through(payload: Any, next: Any) -> Any:
                return await next(payload)

            h.rt.hooks.waterfall("tools/execute", through)
        await h.run()
        events = h.events
    assert _errors(events) == {
        "c1": {"name": "_StrRaises", "code": "TOOL_ERROR"},
        "c2": {"name": "_StrNotText", "code": "TOOL_ERROR"},
    }
    texts = _texts(events)
    assert texts["c1"] == "Error: _StrRaises (its message could not be read: RuntimeError)"
    assert texts["c2"] == "Error: _StrNotText (its message could not be read: TypeError)"
    assert turn_ends(events) == [{"kind": "completed"}]
    assert_well_formed(events)


class _Halt(BaseException):
    """A BaseException that is not an Exception: not a tool's answer."""


async def test_a_base_exception_from_a_handler_propagates(autojump_clock):
    # Only an Exception is a TOOL_ERROR result: KeyboardInterrupt, SystemExit and other
    # BaseExceptions propagate out of the runtime (trio's rule), after the log is closed.
    async def halt(arguments: Any, context: Any) -> str:
        raise _Halt("stop everything")

    stopper = Tool(name="halt", description="halts", parameters={}, handler=halt)
    raised: BaseException | None = None
    try:
        async with harness(
            [Reply.tool_calls(("halt", {}, "c1")), Reply.text("never")], tools=[stopper]
        ) as h:
            h.agent.followup("go")
            await trio.sleep(1000)
    except BaseException as exc:  # the runtime's group (or the bare exception)
        raised = exc
    assert raised is not None
    halts = raised.split(_Halt)[0] if isinstance(raised, BaseExceptionGroup) else raised
    assert isinstance(halts, _Halt | BaseExceptionGroup)
    assert "stop everything" in repr(halts)
    assert trio.current_time() < 1000  # it ended the runtime, not the sleep
    events = h.events
    assert _errors(events) == {"c1": {"name": "Aborted", "code": "ABORTED"}}
    assert_well_formed(events)


# -- tool-pipeline hooks that raise end the turn, never the loop or other agents ---------------
# (docs/design.md#where-failures-go)


async def _ok(arguments: Any, context: Any) -> str:
    return "ok"


OK_TOOL = Tool(name="ok", description="fine", parameters={}, handler=_ok)


def _raise_on_notice(event: Any) -> None:
    raise RuntimeError("observer broke")


OTHER = AgentOptions(id="other", provider="other", model="m")


@pytest.mark.parametrize("hook", ["tools/pre-execute", "tools/execute", "tools/post-execute"])
async def test_a_raising_tool_pipeline_hook_ends_that_turn_only(autojump_clock, hook):
    main_model = ScriptedModel(
        [Reply.tool_calls(("ok", {}, "c1"), ("ok", {}, "c2")), Reply.text("after")]
    )
    other_model = ScriptedModel(
        [Reply.tool_calls(("ok", {}, "o1")), Reply.text("other done")], latency=1.0
    )
    agent_errors: list[Any] = []

    async def failing(payload: Any, next: Any) -> Any:
        if payload["agent"].id == "main":
            raise LookupError(f"{hook} broke")
        return await next(payload)

    async with open_runtime(
        store=MemoryStore(),
        providers={"scripted": main_model, "other": other_model},
        tools=[OK_TOOL],
        clock=trio.current_time,
    ) as rt:
        rt.hooks.waterfall(hook, failing)
        rt.hooks.on("agent/error", _raise_on_notice)  # a broken observer changes nothing
        rt.hooks.on("agent/error", agent_errors.append)
        main = await rt.agents.create(
            options=AgentOptions(id="main", provider="scripted", model="m")
        )
        other = await rt.agents.create(options=OTHER)
        main.agent.followup("go")
        other.agent.followup("go")
        await main.agent.wait_idle()
        await other.agent.wait_idle()
        main.agent.followup("again")  # the loop goes on: the next turn runs
        await main.agent.wait_idle()
        main_events, other_events = main.agent.session.events, other.agent.session.events
    first, second = turn_ends(main_events)
    assert first["kind"] == "error"
    assert first["error"] == {"code": "HOOK_FAILED", "message": f"LookupError: {hook} broke"}
    assert second == {"kind": "completed"}
    assert [plain(e.data["error"]) for e in agent_errors] == [first["error"]]
    assert turn_ends(other_events) == [{"kind": "completed"}]
    assert [
        e.data["message"]["content"][0]["text"] for e in of_type(other_events, "tool/result")
    ] == ["ok"]
    assert_well_formed(main_events)
    assert_well_formed(other_events)


async def test_a_raising_tools_result_observer_is_logged_and_the_turn_completes(
    autojump_clock, caplog
):
    seen: list[Any] = []

    def broken(event: Any) -> None:
        seen.append(event.data["event"].data["message"]["call_id"])
        raise RuntimeError("observer broke")

    async with harness(
        [Reply.tool_calls(("ok", {}, "c1"), ("ok", {}, "c2")), Reply.text("done")],
        tools=[OK_TOOL],
    ) as h:
        h.rt.hooks.on("tools/result", broken)
        with caplog.at_level(logging.ERROR, logger="dsh_agent_loop._hooks"):
            await h.run()
        events = h.events
    assert seen == ["c1", "c2"]  # the first failure did not stop the second notification
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [
        ("observer broke",),
        ("observer broke",),
    ]
    assert turn_ends(events) == [{"kind": "completed"}]
    assert [e.data["message"]["content"][0]["text"] for e in of_type(events, "tool/result")] == [
        "ok",
        "ok",
    ]
    assert_well_formed(events)


async def test_a_hook_exception_whose_str_fails_still_ends_the_turn_readably(autojump_clock):
    async def unprintable(payload: Any, next: Any) -> Any:
        raise _StrRaises

    async with harness(
        [Reply.tool_calls(("ok", {}, "c1")), Reply.text("next turn")], tools=[OK_TOOL]
    ) as h:
        dispose = h.rt.hooks.waterfall("tools/pre-execute", unprintable)
        await h.run("go")
        dispose()
        await h.run("again")  # the loop lives on
        events = h.events
    first, second = turn_ends(events)
    assert first == {
        "kind": "error",
        "error": {"code": "HOOK_FAILED", "message": "_StrRaises: _StrRaises"},
    }
    assert second == {"kind": "completed"}
    assert_well_formed(events)


async def test_a_tool_function_value_json_cannot_hold_is_a_tool_error(autojump_clock):
    # @tool sends a non-str return value as JSON; what JSON cannot hold is not stringified.
    values: dict[str, Any] = {
        "bytes": b"raw",
        "set": {1, 2},
        "object": _Unprintable(),
        "nan": [float("nan")],
        "int": 7,
        "none": None,
    }

    @tool
    async def give(case: str) -> Any:
        """Return what the test says."""
        return values[case]

    calls = [("give", {"case": name}, name) for name in values]
    async with harness([Reply.tool_calls(*calls), Reply.text("done")], tools=[give]) as h:
        await h.run()
        events = h.events
    errors, texts = _errors(events), _texts(events)
    for name, kind in [("bytes", "bytes"), ("set", "set"), ("object", "_Unprintable")]:
        assert errors[name] == {"name": "InvalidToolResult", "code": "TOOL_ERROR"}, name
        assert texts[name].startswith(
            f"Error: InvalidToolResult: the tool returned {kind}, which is not JSON ("
        ), texts[name]
    assert errors["nan"] == {"name": "InvalidToolResult", "code": "TOOL_ERROR"}
    assert "not JSON compliant" in texts["nan"]
    assert (errors["int"], texts["int"]) == (None, "7")  # a JSON value is a result
    assert (errors["none"], texts["none"]) == (None, "null")
    assert turn_ends(events) == [{"kind": "completed"}]
    assert_well_formed(events)


async def test_a_tool_whose_cleanup_replaces_its_cancel_still_stops_the_turn(autojump_clock):
    @tool
    async def stubborn() -> str:
        """Turn a cancel into an error."""
        try:
            await trio.sleep_forever()
        finally:
            raise ValueError("cleanup failed")  # replaces the Cancelled

    async with harness(
        [Reply.tool_calls(("stubborn", {}, "c1")), Reply.text("never")], tools=[stubborn]
    ) as h:
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel()
        await h.agent.wait_idle()
        events = h.events
        assert len(h.model.requests) == 1  # no request after the cancel
    assert turn_ends(events) == [{"kind": "aborted", "cause": "user"}]
    assert _errors(events) == {"c1": {"name": "ValueError", "code": "TOOL_ERROR"}}
    assert_well_formed(events)
