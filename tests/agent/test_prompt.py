"""System prompt reconciliation and request records (docs/design.md#system-prompt), real turns and
sans-I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_agent_loop import (
    AgentOptions,
    Event,
    PreStepDecision,
    PromptAssembly,
    PromptSection,
    Reply,
    tool,
)
from dsh_agent_loop._agent.prompt import SystemDraft, reconcile, render
from dsh_agent_loop.testing import actor_of

from .conftest import assert_well_formed, harness, plain


def system_texts(messages):
    return ["".join(b["text"] for b in m["content"]) for m in messages if m["role"] == "system"]


def persona_options(persona):
    return AgentOptions(id="main", provider="scripted", model="m", persona=persona)


@tool
async def extra() -> str:
    return "x"


async def test_persona_from_options_and_runtime_settings(autojump_clock):
    async with harness(
        [Reply.text("a"), Reply.text("b")],
        options=persona_options("Agent persona."),
        settings={"persona": "Runtime persona."},
    ) as h:
        await h.run("go")
        (system,) = h.of_type("system/message")
        assert system.data["message"]["content"][0]["text"] == "Runtime persona.\n\nAgent persona."
        assert system_texts(h.model.requests[0].messages) == ["Runtime persona.\n\nAgent persona."]
        assert h.model.requests[0].messages[0]["role"] == "system"
        # an unchanged prompt is not written again
        await h.run("again")
        assert len(h.of_type("system/message")) == 1
        assert_well_formed(h.events)


async def test_in_history_route_appends_a_new_node_when_the_persona_changes(autojump_clock):
    replies = [Reply.text("a"), Reply.text("b"), Reply.text("c")]
    async with harness(
        replies, options=persona_options("A"), system_prompt_update="in-history"
    ) as h:
        await h.run("one")
        actor_of(h.agent).scope.persona = "B"
        await h.run("two")
        systems = h.of_type("system/message")
        assert [s.surface_op for s in systems] == [None, None]
        assert [s.data["message"]["content"][0]["text"] for s in systems] == ["A", "B"]
        # the new node comes before the step's user message
        types = h.types()
        assert types[types.index("system/message", systems[0].seq + 1) + 1] == "user/message"
        assert [m["role"] for m in h.model.requests[1].messages] == [
            "system",
            "user",
            "assistant",
            "system",
            "user",
        ]
        # the route reports in-history once, in request/context
        (context,) = h.of_type("request/context")
        assert context.data["system_prompt_update"] == "in-history"
        # switching back to the old text appends again (the latest node is what counts)
        actor_of(h.agent).scope.persona = "A"
        await h.run("three")
        assert [s.data["message"]["content"][0]["text"] for s in h.of_type("system/message")] == [
            "A",
            "B",
            "A",
        ]
        assert_well_formed(h.events)


async def test_head_route_replaces_node_zero(autojump_clock):
    async with harness([Reply.text("a"), Reply.text("b")], options=persona_options("A")) as h:
        await h.run("one")
        head = h.of_type("system/message")[0]
        actor_of(h.agent).scope.persona = "B"
        await h.run("two")
        replacement = h.of_type("system/message")[1]
        assert plain(replacement.surface_op) == {
            "op": "replace",
            "start_seq": head.seq,
            "end_seq": head.seq,
        }
        assert replacement.source_event_seqs == (head.seq,)
        assert replacement.data["message"]["content"][0]["text"] == "B"
        # derived messages show only the effective prompt, at the head
        derived = h.agent.session.derive_messages()
        assert system_texts(derived) == ["B"]
        assert derived[0]["role"] == "system"
        assert system_texts(h.model.requests[1].messages) == ["B"]
        # the first request keeps what it was sent
        assert system_texts(h.model.requests[0].messages) == ["A"]
        assert_well_formed(h.events)


async def test_a_new_series_consolidates_in_history_nodes(autojump_clock):
    replies = [Reply.text("a"), Reply.text("b"), Reply.text("c")]
    async with harness(
        replies, options=persona_options("A"), system_prompt_update="in-history"
    ) as h:
        await h.run("one")
        actor_of(h.agent).scope.persona = "B"
        await h.run("two")
        head, later = h.of_type("system/message")
        h.rt.add_tool(extra)  # the visible tools change: a new series starts
        await h.run("three")
        empty, new_head = h.of_type("system/message")[2:]
        # every non-empty later node is emptied first, then the head is replaced
        assert plain(empty.surface_op) == {
            "op": "replace",
            "start_seq": later.seq,
            "end_seq": later.seq,
        }
        assert empty.data["message"]["content"] == ()
        assert plain(new_head.surface_op) == {
            "op": "replace",
            "start_seq": head.seq,
            "end_seq": head.seq,
        }
        assert new_head.data["message"]["content"][0]["text"] == "B"
        assert empty.seq < new_head.seq
        assert system_texts(h.model.requests[2].messages) == ["B"]
        assert h.model.requests[2].messages[0]["role"] == "system"
        header = h.of_type("request/header")[-1]
        assert header.data["reason"] == "change"
        assert header.data["starts_series"] is True
        assert [t["name"] for t in header.data["header"]["tools"]] == ["extra"]
        assert_well_formed(h.events)


async def test_pre_step_can_start_a_request_series(autojump_clock):
    async def series(payload, next):
        decision = await next(payload)
        return PreStepDecision.enter(decision.messages, starts_request_series=payload["turn"] == 2)

    replies = [Reply.text("a"), Reply.text("b")]
    async with harness(
        replies, options=persona_options("A"), system_prompt_update="in-history"
    ) as h:
        h.rt.hooks.waterfall("agent/pre-step", series)
        await h.run("one")
        await h.run("two")
        headers = h.of_type("request/header")
        assert [e.data["reason"] for e in headers] == ["initial", "series"]
        assert "starts_series" not in headers[1].data
        # the head already has the render: consolidation writes nothing
        assert len(h.of_type("system/message")) == 1


async def test_a_foreign_replacement_starts_a_series(autojump_clock):
    async with harness([Reply.text("a"), Reply.text("b")]) as h:
        await h.run("one")
        user = h.of_type("user/message")[0]
        answer = h.of_type("assistant/message")[0]
        summary = Event(
            "user/message",
            None,
            0.0,
            {
                "message": {
                    "role": "user",
                    "id": "summary-1",
                    "content": ({"type": "text", "text": "summary"},),
                }
            },
            surface_op={"op": "replace", "start_seq": user.seq, "end_seq": answer.seq},
        )
        actor_of(h.agent).log.append(summary)
        await h.run("two")
        assert [e.data["reason"] for e in h.of_type("request/header")] == ["initial", "series"]
        messages = h.model.requests[1].messages
        assert [m["content"][0]["text"] for m in messages] == ["summary", "two"]
        assert_well_formed(h.events)


async def test_request_context_is_written_only_on_change(autojump_clock):
    async def switch(payload, next):
        if payload["turn"] == 3:
            payload = {**payload, "config": {**payload["config"], "model": "m2"}}
        return await next(payload)

    replies = [Reply.text("a"), Reply.text("b"), Reply.text("c"), Reply.text("d")]
    async with harness(replies, options=persona_options("A")) as h:
        h.rt.hooks.waterfall("agent/request", switch)
        for text in ("1", "2", "3", "4"):
            await h.run(text)
        contexts = h.of_type("request/context")
        assert [plain(c.data) for c in contexts] == [
            {"provider": "scripted", "model": "m"},
            {"provider": "scripted", "model": "m2"},
        ]
        headers = h.of_type("request/header")
        assert [e.data["reason"] for e in headers] == ["initial", "change"]
        # a model switch continues the series: no consolidation, no series flag
        assert "starts_series" not in headers[1].data
        assert len(h.of_type("system/message")) == 1
        # later requests start from the last logged config
        assert [r.config["model"] for r in h.model.requests] == ["m", "m", "m2", "m2"]
        assert_well_formed(h.events)


async def test_request_header_resume_reason_on_a_resumed_agent(autojump_clock):
    options = persona_options("A")
    async with harness([Reply.text("a"), Reply.text("b")], options=options) as h:
        await h.run("one")
        sid = h.agent.session_id
        await h.handle.dispose()
        again = await h.rt.agents.resume(sid, options=options)
        again.agent.followup("two")
        await again.agent.wait_idle()
        events = again.agent.session.events
        headers = [e for e in events if e.type == "request/header"]
        assert [e.data["reason"] for e in headers] == ["initial", "resume"]
        assert headers[1].data["header"] == headers[0].data["header"]
        # an unchanged route writes no second request/context, the prompt is unchanged
        assert len([e for e in events if e.type == "request/context"]) == 1
        assert len([e for e in events if e.type == "system/message"]) == 1
        assert_well_formed(events)


async def test_assemble_hook_controls_sections_and_tools(autojump_clock):
    async def assemble(payload, next):
        base = await next(payload)
        return PromptAssembly(
            (*base.sections, PromptSection("rules", "Be brief."), PromptSection("x", "")), ()
        )

    async with harness([Reply.text("a")], options=persona_options("A"), tools=[extra]) as h:
        h.rt.hooks.waterfall("system-prompt/assemble", assemble)
        await h.run("go")
        assert system_texts(h.model.requests[0].messages) == ["A\n\nBe brief."]
        assert h.model.requests[0].tools == ()
        assert "tools" not in h.of_type("request/header")[0].data["header"]


async def test_an_empty_prompt_reserves_node_zero_without_a_wire_message(autojump_clock):
    async with harness([Reply.text("a"), Reply.text("b")]) as h:
        await h.run("one")
        (node,) = h.of_type("system/message")
        assert node.data["message"]["content"] == ()
        assert system_texts(h.agent.session.derive_messages()) == []
        actor_of(h.agent).scope.persona = "Now with a persona."
        await h.run("two")
        replacement = h.of_type("system/message")[1]
        assert plain(replacement.surface_op)["start_seq"] == node.seq
        assert system_texts(h.model.requests[1].messages) == ["Now with a persona."]
        assert h.model.requests[1].messages[0]["role"] == "system"


# -- the decision table, sans-I/O ---------------------------------------------------------------


def test_render_joins_non_empty_sections():
    assembly = PromptAssembly(
        (PromptSection("a", "one"), PromptSection("b", ""), PromptSection("c", "two"))
    )
    assert render(assembly) == "one\n\ntwo"
    assert render(PromptAssembly()) == ""


@pytest.mark.parametrize(
    ("nodes", "rendered", "in_history", "new_series", "expected"),
    [
        ([], "P", True, False, [SystemDraft("P")]),
        ([], "", False, False, [SystemDraft("")]),
        ([(5, "P")], "P", True, False, []),
        ([(5, "P")], "Q", True, False, [SystemDraft("Q")]),
        ([(5, "P")], "Q", False, False, [SystemDraft("Q", 5)]),
        ([(5, "P"), (9, "Q")], "Q", True, False, []),
        ([(5, "P"), (9, "Q")], "Q", True, True, [SystemDraft("", 9), SystemDraft("Q", 5)]),
        # the effective text already equals the render: still consolidated
        ([(5, "P"), (9, "Q")], "Q", False, False, [SystemDraft("", 9), SystemDraft("Q", 5)]),
        ([(5, "P"), (9, "")], "P", False, False, []),
        ([(5, "P"), (9, "Q")], "", True, False, [SystemDraft("", 9), SystemDraft("", 5)]),
        ([(5, ""), (9, "Q")], "Q", True, False, []),
        ([(5, ""), (9, "Q")], "Q", False, False, [SystemDraft("", 9), SystemDraft("Q", 5)]),
    ],
)
def test_reconcile_table(nodes, rendered, in_history, new_series, expected):
    assert reconcile(nodes, rendered, in_history=in_history, new_series=new_series) == expected


def naive_reconcile(nodes, rendered, in_history, new_series):
    """The decision table of docs/design.md#system-prompt, read literally."""
    if len(nodes) == 0:
        return [("append", rendered)]
    replace_mode = (not in_history) or new_series or rendered == ""
    if replace_mode:
        out = []
        for i, (seq, text) in enumerate(nodes):
            if i > 0 and text != "":
                out.append(("replace", seq, ""))
        if nodes[0][1] != rendered:
            out.append(("replace", nodes[0][0], rendered))
        return out
    non_empty = [text for _, text in nodes if text != ""]
    latest = non_empty[-1] if non_empty else ""
    if latest == rendered:
        return []
    return [("append", rendered)]


def as_tuples(drafts):
    return [
        ("append", d.text) if d.replaces is None else ("replace", d.replaces, d.text)
        for d in drafts
    ]


def apply(nodes, drafts):
    """Apply drafts to a node list: appends add nodes, replacements swap texts in place."""
    nodes = list(nodes)
    next_seq = max((s for s, _ in nodes), default=0) + 1
    for d in drafts:
        if d.replaces is None:
            nodes.append((next_seq, d.text))
            next_seq += 1
        else:
            nodes = [(s, d.text) if s == d.replaces else (s, t) for s, t in nodes]
    return nodes


texts_ = st.sampled_from(["", "A", "B", "A\n\nB"])


@st.composite
def node_lists(draw):
    texts = draw(st.lists(texts_, max_size=6))
    seqs = sorted(draw(st.sets(st.integers(0, 1000), min_size=len(texts), max_size=len(texts))))
    return list(zip(seqs, texts, strict=True))


@given(node_lists(), texts_, st.booleans(), st.booleans())
def test_reconcile_matches_the_spec_and_reaches_the_render(nodes, rendered, in_history, new_series):
    drafts = reconcile(nodes, rendered, in_history=in_history, new_series=new_series)
    assert as_tuples(drafts) == naive_reconcile(nodes, rendered, in_history, new_series)
    after = apply(nodes, drafts)
    effective = next((t for _, t in reversed(after) if t), "")
    assert effective == rendered
    # the head is replaced last, and only nodes that exist are replaced
    replaced = [d.replaces for d in drafts if d.replaces is not None]
    assert all(r in {s for s, _ in nodes} for r in replaced)
    if nodes and nodes[0][0] in replaced:
        assert replaced[-1] == nodes[0][0]
    # reconciling the result again is a no-op (when the mode does not force a series)
    if not new_series:
        assert reconcile(after, rendered, in_history=in_history, new_series=False) == []
