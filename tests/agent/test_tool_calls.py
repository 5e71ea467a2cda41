"""Tool scheduling and the tool pipeline (docs/design.md#tools): order, limits, barriers, errors,
durability."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import trio

from dsh_agent_loop import Deny, Reply, Tool, ToolContext, ToolResult, tool
from dsh_agent_loop.testing import actor_of

from .conftest import assert_well_formed, harness, plain, turn_ends


class Tracker:
    """Counts handlers in flight and records (name, start, end) in virtual time."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.spans: dict[str, tuple[float, float]] = {}

    async def run(self, label: str, seconds: float) -> str:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        start = trio.current_time()
        try:
            await trio.sleep(seconds)
        finally:
            self.in_flight -= 1
        self.spans[label] = (start, trio.current_time())
        return f"{label} done"


def result_ids(h) -> list[str]:
    return [e.data["message"]["call_id"] for e in h.of_type("tool/result")]


def result_by_id(h, call_id):
    return next(e for e in h.of_type("tool/result") if e.data["message"]["call_id"] == call_id)


def call_seq(h, call_id):
    return next(e.seq for e in h.of_type("tool/call") if e.data["call_id"] == call_id)


async def test_exclusive_then_parallel_under_a_limit_of_two(autojump_clock):
    t = Tracker()

    @tool(execution_mode="exclusive")
    async def barrier(label: str) -> str:
        return await t.run(label, 1)

    @tool
    async def work(label: str, seconds: float) -> str:
        return await t.run(label, seconds)

    calls = [
        ("barrier", {"label": "x"}, "cx"),
        ("work", {"label": "p1", "seconds": 2}, "p1"),
        ("work", {"label": "p2", "seconds": 1}, "p2"),
        ("work", {"label": "p3", "seconds": 1}, "p3"),
        ("work", {"label": "p4", "seconds": 1}, "p4"),
    ]
    async with harness(
        [Reply.tool_calls(*calls), Reply.text("ok")],
        tools=[barrier, work],
        max_parallel_tool_calls=2,
    ) as h:
        await h.run()
        assert t.max_in_flight == 2
        exclusive_result = result_by_id(h, "cx")
        for pid in ("p1", "p2", "p3", "p4"):
            assert exclusive_result.seq < call_seq(h, pid)
        # the exclusive ran alone, before the pool started
        assert t.spans["x"] == (0.0, 1.0)
        # rolling pool: p3 takes p2's slot at t=2, p4 takes p1's at t=3
        assert t.spans["p1"] == (1.0, 3.0)
        assert t.spans["p2"] == (1.0, 2.0)
        assert t.spans["p3"] == (2.0, 3.0)
        assert t.spans["p4"] == (3.0, 4.0)
        assert [e.data["call_id"] for e in h.of_type("tool/call")] == ["cx", "p1", "p2", "p3", "p4"]
        assert result_ids(h) == ["cx", "p1", "p2", "p3", "p4"]
        assert_well_formed(h.events)


async def test_exclusive_waits_for_earlier_calls_and_holds_back_later_ones(autojump_clock):
    t = Tracker()

    @tool(execution_mode="exclusive")
    async def barrier(label: str) -> str:
        assert t.in_flight == 0  # runs alone
        return await t.run(label, 1)

    @tool
    async def work(label: str, seconds: float) -> str:
        return await t.run(label, seconds)

    calls = [
        ("work", {"label": "a", "seconds": 3}, "a"),
        ("work", {"label": "b", "seconds": 1}, "b"),
        ("barrier", {"label": "x"}, "x"),
        ("work", {"label": "c", "seconds": 1}, "c"),
    ]
    async with harness([Reply.tool_calls(*calls), Reply.text("ok")], tools=[barrier, work]) as h:
        await h.run()
        assert t.spans["a"] == (0.0, 3.0)
        assert t.spans["b"] == (0.0, 1.0)
        assert t.spans["x"] == (3.0, 4.0)
        assert t.spans["c"] == (4.0, 5.0)
        # the exclusive call's tool/call waits for every earlier result
        assert result_by_id(h, "a").seq < call_seq(h, "x") < call_seq(h, "c")
        assert_well_formed(h.events)


async def test_results_commit_in_model_order_whatever_the_completion_order(autojump_clock):
    t = Tracker()

    @tool
    async def work(label: str, seconds: float) -> str:
        return await t.run(label, seconds)

    calls = [
        ("work", {"label": "slow", "seconds": 3}, "c1"),
        ("work", {"label": "fast", "seconds": 1}, "c2"),
        ("work", {"label": "mid", "seconds": 2}, "c3"),
    ]
    async with harness([Reply.tool_calls(*calls), Reply.text("ok")], tools=[work]) as h:
        await h.run()
        assert t.spans["fast"][1] < t.spans["mid"][1] < t.spans["slow"][1]
        results = h.of_type("tool/result")
        assert result_ids(h) == ["c1", "c2", "c3"]
        # the fast result waited for the slow one before it was appended
        assert [r.time for r in results] == [3.0, 3.0, 3.0]
        assert [r.data["message"]["content"][0]["text"] for r in results] == [
            "slow done",
            "fast done",
            "mid done",
        ]
        types = h.types()
        first_result = types.index("tool/result")
        assert types[first_result - 3 : first_result] == ["tool/call"] * 3
        assert_well_formed(h.events)


async def test_limit_of_one_is_serial(autojump_clock):
    t = Tracker()

    @tool
    async def work(label: str) -> str:
        return await t.run(label, 1)

    calls = [("work", {"label": f"w{i}"}, f"c{i}") for i in range(3)]
    async with harness(
        [Reply.tool_calls(*calls), Reply.text("ok")], tools=[work], max_parallel_tool_calls=1
    ) as h:
        await h.run()
        assert t.max_in_flight == 1
        assert [t.spans[f"w{i}"] for i in range(3)] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]


async def test_limit_is_read_from_live_settings_at_each_batch(autojump_clock):
    t = Tracker()

    @tool
    async def work(label: str) -> str:
        return await t.run(label, 1)

    batch = [("work", {"label": f"w{i}"}) for i in range(4)]
    replies = [Reply.tool_calls(*batch), Reply.text("a"), Reply.tool_calls(*batch), Reply.text("b")]
    async with harness(replies, tools=[work]) as h:
        await h.run("one")
        assert t.max_in_flight == 4  # default limit is 10
        t.max_in_flight = 0
        h.rt.settings.update_user_layer({"maxParallelToolCalls": 3})
        await h.run("two")
        assert t.max_in_flight == 3
        assert_well_formed(h.events)


async def test_keyed_exclusivity_serialises_equal_keys_only(autojump_clock):
    t = Tracker()

    @tool(concurrency_key=lambda args: args["key"])
    async def keyed(key: str, label: str) -> str:
        return await t.run(label, 2)

    calls = [
        ("keyed", {"key": "a", "label": "a1"}, "c1"),
        ("keyed", {"key": "b", "label": "b1"}, "c2"),
        ("keyed", {"key": "a", "label": "a2"}, "c3"),
        ("keyed", {"key": "a", "label": "a3"}, "c4"),
    ]
    async with harness([Reply.tool_calls(*calls), Reply.text("ok")], tools=[keyed]) as h:
        await h.run()
        assert t.spans["a1"] == (0.0, 2.0)
        assert t.spans["b1"] == (0.0, 2.0)  # a different key overlaps
        assert t.spans["a2"] == (2.0, 4.0)  # the same key waits, in model order
        assert t.spans["a3"] == (4.0, 6.0)
        assert result_ids(h) == ["c1", "c2", "c3", "c4"]
        assert_well_formed(h.events)


async def test_keyed_exclusivity_with_the_tool_class(autojump_clock):
    t = Tracker()

    async def handler(args, ctx):
        return await t.run(args["label"], 1)

    keyed = Tool(
        name="keyed",
        description="keyed by path",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "label": {"type": "string"}},
            "required": ["path", "label"],
        },
        handler=handler,
        concurrency_key=lambda args: args["path"],
    )
    calls = [
        ("keyed", {"path": "/x", "label": "x1"}),
        ("keyed", {"path": "/x", "label": "x2"}),
        ("keyed", {"path": "/y", "label": "y1"}),
    ]
    async with harness([Reply.tool_calls(*calls), Reply.text("ok")], tools=[keyed]) as h:
        await h.run()
        assert t.spans == {"x1": (0.0, 1.0), "x2": (1.0, 2.0), "y1": (0.0, 1.0)}
        assert t.max_in_flight == 2


async def test_tool_call_is_durable_before_its_handler_runs(autojump_clock):
    seen = {}
    box = []

    async def read_store():
        h = box[0]
        stored = await h.stored()
        return [e for e in stored if e.type == "tool/call"]

    @tool
    async def probe(label: str, ctx: ToolContext) -> str:
        calls = await read_store()
        seen[ctx.call_id] = [e.data["call_id"] for e in calls]
        return "ok"

    @tool(execution_mode="exclusive")
    async def excl(ctx: ToolContext) -> str:
        calls = await read_store()
        seen[ctx.call_id] = [e.data["call_id"] for e in calls]
        return "ok"

    calls = [
        ("probe", {"label": "a"}, "c1"),
        ("probe", {"label": "b"}, "c2"),
        ("excl", {}, "c3"),
        ("probe", {"label": "c"}, "c4"),
    ]
    replies = [
        Reply.tool_calls(*calls),
        Reply.tool_calls(("probe", {"label": "solo"}, "s1")),
        Reply.text("ok"),
    ]
    async with harness(replies, tools=[probe, excl]) as h:
        box.append(h)
        await h.run()
        for call_id, stored_calls in seen.items():
            assert call_id in stored_calls, (call_id, stored_calls)
        assert set(seen) == {"c1", "c2", "c3", "c4", "s1"}
        # calls admitted in the same pass share one flush
        assert seen["c1"] == seen["c2"] == ["c1", "c2"]
        assert_well_formed(h.events)


async def test_every_flush_of_a_turn_goes_through_the_one_barrier(autojump_clock, monkeypatch):
    """The durability barrier has one entry point, the actor's ``flush``, for every batch shape."""
    callers: list[str] = []
    barrier: list[int] = []

    @tool
    async def probe(label: str) -> str:
        return "ok"

    @tool(execution_mode="exclusive")
    async def excl() -> str:
        return "ok"

    replies = [
        Reply.tool_calls(("probe", {"label": "solo"}, "s1")),  # the one-call path
        Reply.tool_calls(("probe", {"label": "a"}, "c1"), ("excl", {}, "c2")),
        Reply.text("ok"),
    ]
    async with harness(replies, tools=[probe, excl]) as h:
        writer_type = type(actor_of(h.agent).writer)
        original_flush = writer_type.flush
        actor_type = type(actor_of(h.agent))
        original_barrier = actor_type.flush

        def flush(self):  # the writer's flush: who asked?
            frame = sys._getframe(1).f_code
            callers.append(f"{Path(frame.co_filename).parent.name}/{frame.co_name}")
            return original_flush(self)

        def counted(self):
            barrier.append(1)
            return original_barrier(self)

        monkeypatch.setattr(writer_type, "flush", flush)
        monkeypatch.setattr(actor_type, "flush", counted)
        await h.run()
        monkeypatch.undo()
        assert callers  # the turn flushed ...
        assert set(callers) == {"_agent/flush"}  # ... only through the one barrier
        assert len(barrier) == len(callers) >= 4  # one call, a pass, the exclusive call, the end
        assert_well_formed(h.events)


async def test_tool_context_describes_the_call(autojump_clock):
    got = []

    @tool
    async def who(ctx: ToolContext) -> str:
        got.append(ctx)
        return "me"

    async with harness(
        [Reply.tool_calls(("who", {}, "cid-9")), Reply.text("ok")], tools=[who]
    ) as h:
        await h.run()
        (ctx,) = got
        assert (ctx.agent_id, ctx.session_id, ctx.call_id, ctx.turn, ctx.step) == (
            "main",
            h.agent.session_id,
            "cid-9",
            1,
            1,
        )
        # the ToolContext parameter is not part of the schema
        assert "ctx" not in who.parameters["properties"]


async def test_tool_errors_are_results_and_the_batch_goes_on(autojump_clock):
    ran = []

    @tool
    async def note(text: str) -> str:
        ran.append(text)
        return f"noted {text}"

    @tool
    async def boom() -> str:
        raise ValueError("kaput")

    calls = [
        ("missing", {}, "u1"),
        ("note", "{not json", "j1"),
        ("note", "[1, 2]", "o1"),
        ("note", {"text": 5}, "s1"),
        ("note", {"text": "ok", "extra": 1}, "s2"),
        ("boom", {}, "e1"),
        ("note", {"text": "fine"}, "f1"),
    ]
    async with harness([Reply.tool_calls(*calls), Reply.text("ok")], tools=[note, boom]) as h:
        await h.run()
        assert ran == ["fine"]
        codes = {
            e.data["message"]["call_id"]: (e.data.get("error") or {}).get("code")
            for e in h.of_type("tool/result")
        }
        assert codes == {
            "u1": "UNKNOWN_TOOL",
            "j1": "INVALID_ARGUMENTS",
            "o1": "INVALID_ARGUMENTS",
            "s1": "INVALID_ARGUMENTS",
            "s2": "INVALID_ARGUMENTS",
            "e1": "TOOL_ERROR",
            "f1": None,
        }
        assert result_ids(h) == ["u1", "j1", "o1", "s1", "s2", "e1", "f1"]
        # every call, rejected or not, gets its tool/call at its place in model order
        assert [e.data["call_id"] for e in h.of_type("tool/call")] == result_ids(h)
        for e in h.of_type("tool/result"):
            block = e.data["message"]["content"][0]
            assert block["is_error"] == (e.data["message"]["call_id"] != "f1")
        text = {cid: result_by_id(h, cid).data["message"]["content"][0]["text"] for cid in codes}
        assert text["e1"].startswith("Error:")
        assert "kaput" in text["e1"]
        assert "{not json" in text["j1"]
        assert text["f1"] == "noted fine"
        # the model reads every result in the next request
        tool_messages = [m for m in h.model.requests[1].messages if m["role"] == "tool"]
        assert [m["call_id"] for m in tool_messages] == result_ids(h)
        assert_well_formed(h.events)


async def test_pre_execute_deny_and_rewrite(autojump_clock):
    ran = []

    @tool
    async def note(text: str) -> str:
        ran.append(text)
        return f"noted {text}"

    async def policy(payload, next):
        if payload["arguments"]["text"] == "secret":
            return Deny("no")
        if payload["arguments"]["text"] == "rewrite me":
            return await next({**payload, "arguments": {"text": "rewritten"}})
        if payload["arguments"]["text"] == "bad rewrite":
            return await next({**payload, "arguments": {"text": 7}})
        return await next(payload)

    calls = [
        ("note", {"text": "secret"}, "d1"),
        ("note", {"text": "rewrite me"}, "r1"),
        ("note", {"text": "bad rewrite"}, "b1"),
        ("note", {"text": "plain"}, "p1"),
    ]
    async with harness([Reply.tool_calls(*calls), Reply.text("ok")], tools=[note]) as h:
        h.rt.hooks.waterfall("tools/pre-execute", policy)
        await h.run()
        assert sorted(ran) == ["plain", "rewritten"]  # handlers of one pass start in any order
        denied = result_by_id(h, "d1")
        assert plain(denied.data["error"])["code"] == "DENIED"
        assert "no" in denied.data["message"]["content"][0]["text"]
        assert result_by_id(h, "b1").data["error"]["code"] == "INVALID_ARGUMENTS"
        assert result_by_id(h, "r1").data["message"]["content"][0]["text"] == "noted rewritten"
        # the tool/call keeps the model's raw arguments
        assert h.of_type("tool/call")[1].data["arguments"] == '{"text":"rewrite me"}'
        assert_well_formed(h.events)


async def test_execute_and_post_execute_hooks_wrap_the_handler(autojump_clock):
    order = []

    @tool
    async def note(text: str) -> str:
        order.append("handler")
        return text

    async def around(payload, next):
        order.append("execute")
        return await next(payload)

    async def post(payload, next):
        order.append("post")
        return ToolResult(payload["result"].content.upper(), meta={"checked": True})

    async with harness(
        [Reply.tool_calls(("note", {"text": "hi"}, "c1")), Reply.text("ok")], tools=[note]
    ) as h:
        h.rt.hooks.waterfall("tools/execute", around)
        h.rt.hooks.waterfall("tools/post-execute", post)
        await h.run()
        assert order == ["execute", "handler", "post"]
        (result,) = h.of_type("tool/result")
        assert result.data["message"]["content"][0]["text"] == "HI"
        assert plain(result.data["meta"]) == {"checked": True}


async def test_non_string_return_is_sent_as_json(autojump_clock):
    @tool
    async def data() -> dict:
        return {"a": [1, 2]}

    async with harness([Reply.tool_calls(("data", {}, "c1")), Reply.text("ok")], tools=[data]) as h:
        await h.run()
        (result,) = h.of_type("tool/result")
        assert result.data["message"]["content"][0]["text"] == '{"a": [1, 2]}'


async def test_options_tools_limit_what_the_model_sees(autojump_clock):
    from dsh_agent_loop import AgentOptions

    @tool
    async def seen() -> str:
        return "seen"

    @tool
    async def hidden() -> str:
        return "hidden"

    options = AgentOptions(id="main", provider="scripted", model="m", tools=("seen",))
    replies = [Reply.tool_calls(("hidden", {}, "c1")), Reply.text("ok")]
    async with harness(replies, tools=[seen, hidden], options=options) as h:
        await h.run()
        assert [t["name"] for t in h.model.requests[0].tools] == ["seen"]
        (result,) = h.of_type("tool/result")
        assert result.data["error"]["code"] == "UNKNOWN_TOOL"
        assert turn_ends(h.events) == [{"kind": "completed"}]


# -- property: the scheduler's guarantees hold for random batches ---------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

call_specs = st.lists(
    st.tuples(
        st.sampled_from(["parallel", "parallel", "exclusive", "keyed"]),
        st.integers(0, 3),  # seconds
        st.sampled_from(["k1", "k2"]),
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=60, deadline=None)
@given(call_specs, st.integers(1, 4))
def test_scheduling_guarantees_for_random_batches(specs, limit):
    from trio.testing import MockClock

    spans: dict[str, tuple[float, float]] = {}
    t = Tracker()

    async def body(args):
        start = trio.current_time()
        await t.run(args["id"], args["seconds"])
        spans[args["id"]] = (start, trio.current_time())
        return "ok"

    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "seconds": {"type": "number"},
            "key": {"type": "string"},
        },
    }

    def make(name, **kw):
        async def handler(args, ctx):
            return await body(args)

        return Tool(name=name, description="", parameters=schema, handler=handler, **kw)

    tools = [
        make("parallel"),
        make("exclusive", execution_mode="exclusive"),
        make("keyed", concurrency_key=lambda a: a["key"]),
    ]
    calls = [
        (kind, {"id": f"c{i}", "seconds": s, "key": k}, f"c{i}")
        for i, (kind, s, k) in enumerate(specs)
    ]

    async def main():
        replies = [Reply.tool_calls(*calls), Reply.text("ok")]
        async with harness(replies, tools=tools, max_parallel_tool_calls=limit) as h:
            await h.run()
            return h.events

    events = trio.run(main, clock=MockClock(autojump_threshold=0))
    ids = [c[2] for c in calls]
    assert [e.data["call_id"] for e in events if e.type == "tool/call"] == ids
    assert [e.data["message"]["call_id"] for e in events if e.type == "tool/result"] == ids
    assert_well_formed(events)
    assert t.max_in_flight <= limit
    for i, (kind, _, key) in enumerate(specs):
        s_i, e_i = spans[f"c{i}"]
        for j, (other_kind, _, other_key) in enumerate(specs):
            if j == i:
                continue
            s_j, e_j = spans[f"c{j}"]
            if kind == "exclusive":
                # waits for every earlier call, holds back every later one
                if j < i:
                    assert e_j <= s_i
                else:
                    assert s_j >= e_i
            if kind == other_kind == "keyed" and key == other_key and j > i:
                assert s_j >= e_i  # equal keys serialise in model order


# -- limits on what a reply asks for and what a tool returns (docs/limits.md) ------------------
async def test_calls_past_the_per_reply_cap_get_tool_errors_and_never_run(autojump_clock):
    from dsh_agent_loop import Limits

    ran: list[int] = []

    @tool
    async def work(n: int) -> str:
        ran.append(n)
        return f"did {n}"

    calls = [("work", {"n": n}, f"c{n}") for n in range(5)]
    async with harness(
        [Reply.tool_calls(*calls), Reply.text("ok")],
        tools=[work],
        limits=Limits(max_tool_calls_per_reply=3),
    ) as h:
        await h.run()
        assert sorted(ran) == [0, 1, 2]
        assert result_ids(h) == [f"c{n}" for n in range(5)]  # every call has its result, in order
        for n in (3, 4):
            event = result_by_id(h, f"c{n}")
            assert plain(event.data["error"]) == {"name": "TooManyToolCalls", "code": "TOOL_ERROR"}
            text = event.data["message"]["content"][0]["text"]
            assert "5 tool calls" in text
            assert "at most 3" in text
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert_well_formed(h.events)


async def test_the_default_cap_bounds_a_flood_of_calls(autojump_clock):
    ran: list[int] = []

    @tool
    async def work(n: int) -> str:
        ran.append(n)
        return "ok"

    calls = [("work", {"n": n}, f"c{n}") for n in range(300)]
    async with harness([Reply.tool_calls(*calls), Reply.text("ok")], tools=[work]) as h:
        await h.run()
        assert len(ran) == 128
        errors = [e for e in h.of_type("tool/result") if e.data.get("error")]
        assert len(errors) == 300 - 128
        assert_well_formed(h.events)


async def test_a_tool_result_over_the_size_cap_is_cut_with_a_marker(autojump_clock):
    from dsh_agent_loop import Limits

    @tool
    async def dump(kind: str) -> ToolResult | str:
        if kind == "text":
            return "a" * 5000
        if kind == "wide":
            return "é" * 3000  # two bytes each: the cut must not split one
        return ToolResult("b" * 5000, additional_contexts=("c" * 5000,))

    calls = [("dump", {"kind": k}, k) for k in ("text", "wide", "result")]
    async with harness(
        [Reply.tool_calls(*calls), Reply.text("ok")],
        tools=[dump],
        limits=Limits(max_tool_result_bytes=1000),
    ) as h:
        await h.run()
        for call_id, total in (("text", 5000), ("wide", 6000), ("result", 5000)):
            text = result_by_id(h, call_id).data["message"]["content"][0]["text"]
            assert len(text.encode()) <= 1000
            marker = re.search(
                r"\n\[tool result truncated: it was (\d+) bytes; the first (\d+) bytes are "
                r"shown\]$",
                text,
            )
            assert marker is not None, text[-120:]
            assert int(marker[1]) == total
            assert int(marker[2]) == len(text[: marker.start()].encode()) > 800
        wide = result_by_id(h, "wide").data["message"]["content"][0]["text"]
        assert set(wide.split("\n[")[0]) == {"é"}
        injected = [m for m in h.of_type("user/message") if "c" * 10 in str(m.data)]
        assert injected
        assert all(len(m.data["message"]["content"][0]["text"].encode()) <= 1000 for m in injected)
        # the model is sent the cut text, never the whole one
        tool_messages = [m for m in h.model.requests[1].messages if m["role"] == "tool"]
        sent = [b["text"] for m in tool_messages for b in m["content"]]
        assert all(len(t.encode()) <= 1000 for t in sent)
        assert_well_formed(h.events)


async def test_a_large_result_under_the_default_cap_is_stored_whole(autojump_clock):
    @tool
    async def dump() -> str:
        return "x" * (1 << 20)  # exactly the 1 MiB default: kept whole

    @tool
    async def more() -> str:
        return "x" * ((1 << 20) + 1)

    async with harness(
        [Reply.tool_calls(("dump", {}, "d"), ("more", {}, "m")), Reply.text("ok")],
        tools=[dump, more],
    ) as h:
        await h.run()
        assert result_by_id(h, "d").data["message"]["content"][0]["text"] == "x" * (1 << 20)
        cut = result_by_id(h, "m").data["message"]["content"][0]["text"]
        assert "truncated" in cut
        assert len(cut.encode()) <= 1 << 20
