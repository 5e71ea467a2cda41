"""Durable tool approval (docs/design.md#approvals): deferred calls, decisions, continuation,
restarts."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from dsh_agent_loop import (
    AgentClosedError,
    AgentOptions,
    ApprovalRequest,
    MemoryStore,
    Reply,
    ScriptedModel,
    SqliteStore,
    invariants,
    open_runtime,
    tool,
)

from .conftest import OPTIONS, assert_well_formed, harness, plain, turn_ends, user_texts

RAN: list[str] = []


@tool(requires_approval=True)
async def delete(path: str) -> str:
    """Delete a file."""
    RAN.append(f"delete {path}")
    return f"deleted {path}"


@tool
async def look(path: str) -> str:
    """Look at a file."""
    RAN.append(f"look {path}")
    return f"saw {path}"


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def results(events: list[Any]) -> dict[str, tuple[str, str | None]]:
    """call_id -> (text, error code) of every tool/result."""
    out = {}
    for e in events:
        if e.type == "tool/result":
            block = e.data["message"]["content"][0]
            error = e.data.get("error")
            out[e.data["message"]["call_id"]] = (block["text"], error and error["code"])
    return out


def tool_texts(request: Any) -> list[str]:
    return [b["text"] for m in request.messages if m["role"] == "tool" for b in m["content"]]


async def test_a_deferred_call_ends_the_turn_awaiting_approval(autojump_clock: Any) -> None:
    replies = [Reply.tool_calls(("delete", {"path": "a"}, "c1")), Reply.text("done")]
    async with harness(replies, tools=[delete]) as h:
        await h.run()
        agent = h.agent
        assert RAN == []
        assert turn_ends(h.events) == [{"kind": "awaiting-approval", "call_ids": ["c1"]}]
        assert agent.pending_approvals() == (
            ApprovalRequest(call_id="c1", name="delete", arguments={"path": "a"}, turn=1, step=1),
        )
        requested = h.of_type("tool/approval-requested")
        assert [plain(e.data) for e in requested] == [
            {"turn": 1, "step": 1, "call_id": "c1", "name": "delete", "arguments": {"path": "a"}}
        ]
        stored = await h.stored()  # durable: the turn's flush covered the request
        assert "tool/approval-requested" in [e.type for e in stored]
        assert invariants.check(h.events, allow_open_turn=False) == []
        assert len(h.model.requests) == 1

        agent.approve("c1")
        await agent.wait_idle()
        assert RAN == ["delete a"]
        assert agent.pending_approvals() == ()
        assert turn_ends(h.events)[-1] == {"kind": "completed"}
        assert tool_texts(h.model.requests[-1]) == ["deleted a"]
        approval = h.of_type("tool/approval")
        assert [plain(e.data) for e in approval] == [{"call_id": "c1", "decision": "approve"}]
        assert_well_formed(h.events)
        # the result is the continuation's, citing the original tool/call
        call = h.of_type("tool/call")[0]
        result = h.of_type("tool/result")[0]
        assert result.source_event_seqs == (call.seq,)
        assert result.data["turn"] == 2


async def test_deny_gives_a_denied_result_with_the_message(autojump_clock: Any) -> None:
    replies = [Reply.tool_calls(("delete", {"path": "a"}, "c1")), Reply.text("ok, not deleting")]
    async with harness(replies, tools=[delete]) as h:
        await h.run()
        h.agent.deny("c1", "too risky")
        await h.agent.wait_idle()
        assert RAN == []
        assert results(h.events) == {"c1": ("Error: tool call denied: too risky", "DENIED")}
        assert tool_texts(h.model.requests[-1]) == ["Error: tool call denied: too risky"]
        assert [plain(e.data) for e in h.of_type("tool/approval")] == [
            {"call_id": "c1", "decision": "deny", "message": "too risky"}
        ]
        assert turn_ends(h.events)[-1] == {"kind": "completed"}
        assert_well_formed(h.events)


async def test_a_mixed_step_runs_the_other_calls_and_keeps_model_order(
    autojump_clock: Any,
) -> None:
    replies = [
        Reply.tool_calls(
            ("look", {"path": "x"}, "c1"),
            ("delete", {"path": "y"}, "c2"),
            ("look", {"path": "z"}, "c3"),
            ("delete", {"path": "w"}, "c4"),
        ),
        Reply.text("done"),
    ]
    async with harness(replies, tools=[delete, look]) as h:
        await h.run()
        assert sorted(RAN) == ["look x", "look z"]  # parallel: either order
        assert list(results(h.events)) == ["c1", "c3"]
        assert [r.call_id for r in h.agent.pending_approvals()] == ["c2", "c4"]
        assert turn_ends(h.events) == [{"kind": "awaiting-approval", "call_ids": ["c2", "c4"]}]
        assert [e.data["call_id"] for e in h.of_type("tool/call")] == ["c1", "c2", "c3", "c4"]
        h.agent.approve("c4")
        await trio.sleep(1)
        assert len(RAN) == 2  # c2 is still undecided: nothing runs
        assert len(h.model.requests) == 1
        h.agent.deny("c2")
        await h.agent.wait_idle()
        assert RAN[2:] == ["delete w"]
        assert list(results(h.events)) == ["c1", "c3", "c2", "c4"]
        assert results(h.events)["c2"] == ("Error: tool call denied", "DENIED")
        assert sorted(tool_texts(h.model.requests[-1])) == sorted(
            ["saw x", "saw z", "Error: tool call denied", "deleted w"]
        )
        assert_well_formed(h.events)


async def test_a_callable_rule_defers_only_matching_calls(autojump_clock: Any) -> None:
    @tool(requires_approval=lambda args: args["path"].startswith("/etc"))
    async def write(path: str) -> str:
        """Write a file."""
        RAN.append(path)
        return "written"

    replies = [
        Reply.tool_calls(("write", {"path": "/tmp/a"}, "c1"), ("write", {"path": "/etc/b"}, "c2")),
        Reply.text("done"),
    ]
    async with harness(replies, tools=[write]) as h:
        await h.run()
        assert RAN == ["/tmp/a"]
        assert [r.call_id for r in h.agent.pending_approvals()] == ["c2"]


async def test_a_raising_rule_fails_closed(autojump_clock: Any) -> None:
    def rule(args: Any) -> bool:
        raise RuntimeError("bug")

    @tool(requires_approval=rule)
    async def write(path: str) -> str:
        """Write a file."""
        RAN.append(path)
        return "written"

    async with harness([Reply.tool_calls(("write", {"path": "p"}, "c1"))], tools=[write]) as h:
        await h.run()
        assert RAN == []
        assert [r.call_id for r in h.agent.pending_approvals()] == ["c1"]


async def test_options_name_tools_that_need_approval(autojump_clock: Any) -> None:
    options = AgentOptions(id="main", provider="scripted", model="m", require_approval=["look"])
    replies = [Reply.tool_calls(("look", {"path": "x"}, "c1")), Reply.text("done")]
    async with harness(replies, tools=[look], options=options) as h:
        await h.run()
        assert RAN == []
        assert [r.name for r in h.agent.pending_approvals()] == ["look"]


async def test_next_turn_messages_wait_until_every_call_is_decided(autojump_clock: Any) -> None:
    replies = [
        Reply.tool_calls(("delete", {"path": "a"}, "c1")),
        Reply.text("deleted"),
        Reply.text("second answer"),
    ]
    async with harness(replies, tools=[delete]) as h:
        await h.run("first")
        h.agent.followup("second")
        h.agent.steer("careful")
        await h.agent.wait_idle()
        assert len(h.model.requests) == 1
        assert h.agent.inbox.next_turn[0]["content"][0]["text"] == "second"
        assert turn_ends(h.events) == [{"kind": "awaiting-approval", "call_ids": ["c1"]}]
        h.agent.approve("c1")
        await h.agent.wait_idle()
        # the continuation claimed the steer but not the follow-up; the follow-up ran next
        assert user_texts(h.model.requests[1].messages) == ["first", "careful"]
        assert user_texts(h.model.requests[2].messages) == ["first", "careful", "second"]
        assert [e["kind"] for e in turn_ends(h.events)] == [
            "awaiting-approval",
            "completed",
            "completed",
        ]
        # nothing came between the call and its result
        messages = list(h.agent.session.derive_messages())
        roles = [m["role"] for m in messages if m["role"] != "system"]
        assert roles[:3] == ["user", "assistant", "tool"]
        assert_well_formed(h.events)


async def test_cancel_denies_every_pending_call(autojump_clock: Any) -> None:
    replies = [
        Reply.tool_calls(("delete", {"path": "a"}, "c1"), ("delete", {"path": "b"}, "c2")),
        Reply.text("never asked"),
    ]
    async with harness(replies, tools=[delete]) as h:
        await h.run()
        h.agent.cancel()
        await h.agent.wait_idle()
        assert RAN == []
        assert h.agent.pending_approvals() == ()
        assert results(h.events) == {
            "c1": ("Error: tool call denied: cancelled", "DENIED"),
            "c2": ("Error: tool call denied: cancelled", "DENIED"),
        }
        assert turn_ends(h.events)[-1] == {"kind": "aborted", "cause": "user"}
        assert len(h.model.requests) == 1  # the continuation asked no model
        decisions = [plain(e.data) for e in h.of_type("tool/approval")]
        assert decisions[0] == {
            "call_id": "c1",
            "decision": "deny",
            "message": "cancelled",
            "cause": "user",
        }
        assert_well_formed(h.events)


async def test_approve_rejects_unknown_ids(autojump_clock: Any) -> None:
    async with harness([Reply.tool_calls(("delete", {"path": "a"}, "c1"))], tools=[delete]) as h:
        await h.run()
        with pytest.raises(ValueError, match="no pending approval"):
            h.agent.approve("nope")
        h.agent.approve("c1")
        with pytest.raises(ValueError, match="no pending approval"):
            h.agent.deny("c1")  # decided already


async def test_resolve_approvals_returns_the_continuation_result(autojump_clock: Any) -> None:
    replies = [
        Reply.tool_calls(("delete", {"path": "a"}, "c1"), ("delete", {"path": "b"}, "c2")),
        Reply.text("one of two"),
    ]
    async with harness(replies, tools=[delete]) as h:
        await h.run()
        with pytest.raises(ValueError, match="still pending"):
            await h.agent.resolve_approvals({"c1": True})
        assert h.of_type("tool/approval") == []  # nothing decided by a refused call
        result = await h.agent.resolve_approvals({"c1": True, "c2": "not b"})
        assert result.turn == 2
        assert result.text == "one of two"
        assert result.reason["kind"] == "completed"
        assert RAN == ["delete a"]
        assert [(c.call_id, c.error) for c in result.tool_calls] == [("c1", None), ("c2", "DENIED")]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_dispose_leaves_calls_pending_and_resume_restores_them(
    backend: str, tmp_path: Path
) -> None:
    memory = MemoryStore()

    def store() -> Any:
        return memory if backend == "memory" else SqliteStore(tmp_path / "s.db")

    model = ScriptedModel(
        [
            Reply.tool_calls(("delete", {"path": "a"}, "c1")),
            Reply.text("done"),
            Reply.text("later answer"),
        ]
    )
    providers = {"scripted": model}
    async with open_runtime(store=store(), providers=providers, tools=[delete]) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        session_id = handle.agent.session_id
        await handle.dispose()
        with pytest.raises(AgentClosedError):
            handle.agent.approve("c1")
    async with open_runtime(store=store(), providers=providers, tools=[delete]) as rt:
        handle = await rt.agents.resume(session_id, options=OPTIONS)
        agent = handle.agent
        assert [r.call_id for r in agent.pending_approvals()] == ["c1"]
        assert not [e for e in agent.session.events if e.type == "tool/result"]
        agent.followup("later")  # waits behind the pending call
        await agent.wait_idle()
        assert len(model.requests) == 1
        agent.approve("c1")
        await agent.wait_idle()
        assert RAN == ["delete a"]
        assert tool_texts(model.requests[1]) == ["deleted a"]
        assert [e["kind"] for e in turn_ends(agent.session.events)] == [
            "awaiting-approval",
            "completed",
            "completed",
        ]
        assert_well_formed(agent.session.events)


async def test_a_cancel_during_the_step_settles_a_deferred_call(autojump_clock: Any) -> None:
    @tool
    async def slow() -> str:
        """Take a while."""
        await trio.sleep(10)
        return "slow done"

    replies = [
        Reply.tool_calls(("delete", {"path": "a"}, "c1"), ("slow", {}, "c2")),
        Reply.text("never"),
    ]
    async with harness(replies, tools=[delete, slow]) as h:
        h.agent.followup("go")
        await trio.sleep(1)
        assert len(h.of_type("tool/approval-requested")) == 1
        h.agent.cancel()
        await h.agent.wait_idle()
        assert h.agent.pending_approvals() == ()
        assert results(h.events) == {
            "c2": ("Error: tool call aborted", "ABORTED"),
            "c1": ("Error: tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH"),
        }
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert_well_formed(h.events)
        h.agent.followup("next")  # nothing pending: new work runs
        await h.agent.wait_idle()
        assert len(h.model.requests) == 2


async def test_a_decided_continuation_runs_on_resume(autojump_clock: Any) -> None:
    """Decided, then disposed before the continuation started: resume runs it at once."""
    store = MemoryStore()
    model = ScriptedModel([Reply.tool_calls(("delete", {"path": "a"}, "c1")), Reply.text("done")])
    providers = {"scripted": model}
    async with open_runtime(
        store=store, providers=providers, tools=[delete], clock=trio.current_time
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        session_id = handle.agent.session_id
        handle.agent.approve("c1")
        await handle.dispose()  # before the driver ran the continuation
        assert RAN == []
        assert turn_ends(handle.agent.session.events) == [
            {"kind": "awaiting-approval", "call_ids": ["c1"]}
        ]
    async with open_runtime(
        store=store, providers=providers, tools=[delete], clock=trio.current_time
    ) as rt:
        handle = await rt.agents.resume(session_id, options=OPTIONS)
        await handle.agent.wait_idle()
        assert RAN == ["delete a"]
        assert turn_ends(handle.agent.session.events)[-1] == {"kind": "completed"}
        assert_well_formed(handle.agent.session.events)


_CHILD = textwrap.dedent(
    """
    import json, sys
    import trio
    from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, SqliteStore, open_runtime, tool

    path, mode, marker = sys.argv[1], sys.argv[2], sys.argv[3]

    @tool(requires_approval=True)
    async def delete(target: str) -> str:
        "Delete something."
        with open(marker, "a") as f:
            f.write(target + "\\n")
        return "deleted " + target

    async def main():
        model = ScriptedModel(
            [Reply.tool_calls(("delete", {"target": "t"}, "c1")), Reply.text("never")]
        )
        if mode == "resume":
            model = ScriptedModel([Reply.text("all done")])
        options = AgentOptions(id="main", provider="scripted", model="m")
        store = SqliteStore(path)
        async with open_runtime(store=store, providers={"scripted": model}, tools=[delete]) as rt:
            if mode == "request":
                agent = (await rt.agents.create(session_id="s1", options=options)).agent
                agent.followup("please delete t")
                await agent.wait_idle()
                out = {"pending": [r.call_id for r in agent.pending_approvals()]}
            else:
                agent = (await rt.agents.resume("s1", options=options)).agent
                pending = [r.call_id for r in agent.pending_approvals()]
                result = await agent.resolve_approvals({"c1": True})
                tool_texts = [
                    b["text"] for m in model.requests[-1].messages if m["role"] == "tool"
                    for b in m["content"]
                ]
                out = {"pending": pending, "text": result.text, "tool_texts": tool_texts}
        print(json.dumps(out))

    trio.run(main)
    """
)


async def test_an_approval_survives_a_process_restart_on_sqlite(tmp_path: Path) -> None:
    path, marker = tmp_path / "sessions.db", tmp_path / "ran.txt"

    async def child(mode: str) -> Any:
        done = await trio.run_process(
            [sys.executable, "-c", _CHILD, str(path), mode, str(marker)],
            capture_stdout=True,
            capture_stderr=True,
        )
        return json.loads(done.stdout)

    assert await child("request") == {"pending": ["c1"]}
    assert not marker.exists()  # the first process exited without running the call
    assert await child("resume") == {
        "pending": ["c1"],
        "text": "all done",
        "tool_texts": ["deleted t"],
    }
    assert marker.read_text() == "t\n"
    store = SqliteStore(path)
    async with open_runtime(store=store, providers={"scripted": ScriptedModel()}) as rt:
        reader = await rt.store.open("s1", "read")
        events = await reader.read()
        await reader.close()
    assert [e["kind"] for e in turn_ends(events)] == ["awaiting-approval", "completed"]
    assert_well_formed(events)


@pytest.mark.parametrize("key", ["requireApproval", "require_approval"])
async def test_a_config_agent_lists_tools_that_need_approval(key: str, autojump_clock: Any) -> None:
    config = {
        "plugins": [
            {
                "name": "@deepseek-ai/dsh-agent-loop",
                "config": {
                    "agents": [{"id": "main", "provider": "scripted", "model": "m", key: ["look"]}]
                },
            }
        ]
    }
    model = ScriptedModel([Reply.tool_calls(("look", {"path": "x"}, "c1")), Reply.text("done")])
    async with open_runtime(
        config, providers={"scripted": model}, tools=[look], clock=trio.current_time
    ) as rt:
        agent = rt.agents.get("main")
        assert agent is not None
        assert agent.options.require_approval == frozenset({"look"})
        agent.followup("go")
        await agent.wait_idle()
        assert RAN == []
        assert [r.name for r in agent.pending_approvals()] == ["look"]


def test_approval_request_is_a_final_frozen_record() -> None:
    import attrs

    request = ApprovalRequest(call_id="c", name="n", arguments={}, turn=1, step=1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        request.call_id = "d"  # type: ignore[misc]
    assert ApprovalRequest.__final__  # type: ignore[attr-defined]  # set by typing.final


async def _approve_all(rt: Any) -> None:
    handle = await rt.agents.create(options=OPTIONS)
    agent = handle.agent
    agent.followup("go")
    await agent.wait_idle()
    for request in agent.pending_approvals():
        if request.call_id == "c2":
            agent.approve(request.call_id)
        else:
            agent.deny(request.call_id, "no")
    await agent.wait_idle()


def _explore_model() -> dict[str, Any]:
    return {
        "scripted": ScriptedModel(
            [
                Reply.tool_calls(
                    ("look", {"path": "x"}, "c1"),
                    ("delete", {"path": "y"}, "c2"),
                    ("delete", {"path": "z"}, "c3"),
                ),
                Reply.text("done"),
            ]
        )
    }


def test_a_cancel_at_every_checkpoint_keeps_the_log_well_formed() -> None:
    from dsh_agent_loop.testing import explore_cancellation

    async def request_only(rt: Any) -> None:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        agent.followup("go")
        await agent.wait_idle()

    first = explore_cancellation(request_only, providers=_explore_model, tools=(delete, look))
    report = explore_cancellation(_approve_all, providers=_explore_model, tools=(delete, look))
    assert first.failures == report.failures == []
    assert report.checkpoints > first.checkpoints  # the continuation's checkpoints too


async def test_resolve_returns_when_the_continuation_ends_not_when_queued_work_does(
    autojump_clock: Any,
) -> None:
    replies = [
        Reply.tool_calls(("delete", {"path": "a"}, "c1")),
        Reply.text("continued"),
        Reply.text("the follow-up"),
    ]
    async with harness(replies, tools=[delete], latency=1.0) as h:
        await h.run()
        h.agent.followup("queued meanwhile")
        result = await h.agent.resolve_approvals({"c1": True})
        returned = trio.current_time()
        assert (result.turn, result.text) == (2, "continued")
        assert result.pending_approvals == ()
        await h.agent.wait_idle()
        assert trio.current_time() > returned  # turn 3 ran after resolve returned
        assert [e["kind"] for e in turn_ends(h.events)] == [
            "awaiting-approval",
            "completed",
            "completed",
        ]


# -- a cancel reaches only what existed when it was made ---------------------------------------
async def test_run_right_after_a_cancel_of_pending_calls_runs_as_its_own_turn(
    autojump_clock: Any,
) -> None:
    replies = [Reply.tool_calls(("delete", {"path": "a"}, "c1")), Reply.text("answer to next")]
    async with harness(replies, tools=[delete]) as h:
        first = await h.agent.run("first")
        assert first.reason["kind"] == "awaiting-approval"
        h.agent.cancel()
        with trio.fail_after(60):
            result = await h.agent.run("next")
        assert result.text == "answer to next"
        assert result.reason == {"kind": "completed"}
        assert RAN == []
        assert results(h.events)["c1"] == ("Error: tool call denied: cancelled", "DENIED")
        assert turn_ends(h.events) == [
            {"kind": "awaiting-approval", "call_ids": ["c1"]},
            {"kind": "aborted", "cause": "user"},
            {"kind": "completed"},
        ]
        spliced = h.of_type("agent/inbox/spliced")
        assert not any(e.data.get("outcome") for e in spliced)  # "next" was never cancelled
        assert user_texts(h.model.requests[-1].messages)[-1] == "next"
        assert_well_formed(h.events)


async def test_a_steer_after_a_cancel_is_not_claimed_by_the_aborted_continuation(
    autojump_clock: Any,
) -> None:
    replies = [Reply.tool_calls(("delete", {"path": "a"}, "c1")), Reply.text("steered")]
    async with harness(replies, tools=[delete]) as h:
        await h.run()
        h.agent.cancel()
        h.agent.steer("look here instead")
        await h.agent.wait_idle()
        assert turn_ends(h.events)[1:] == [
            {"kind": "aborted", "cause": "user"},
            {"kind": "completed"},
        ]
        assert "look here instead" in user_texts(h.model.requests[-1].messages)
        assert_well_formed(h.events)


async def test_cancel_aborts_a_continuation_already_due(autojump_clock: Any) -> None:
    replies = [Reply.tool_calls(("delete", {"path": "a"}, "c1")), Reply.text("after")]
    async with harness(replies, tools=[delete]) as h:
        await h.run()
        h.agent.approve("c1")  # the continuation is due, not yet started
        h.agent.cancel()
        await h.agent.wait_idle()
        assert RAN == []  # the approved call never ran
        assert results(h.events)["c1"] == (
            "Error: tool call aborted before dispatch",
            "ABORTED_BEFORE_DISPATCH",
        )
        assert turn_ends(h.events)[-1] == {"kind": "aborted", "cause": "user"}
        assert h.agent.pending_approvals() == ()
        with trio.fail_after(60):
            assert (await h.agent.run("then")).text == "after"
        assert_well_formed(h.events)


async def test_a_message_claimed_by_hand_outside_a_turn_ends_its_run(autojump_clock: Any) -> None:
    from dsh_agent_loop import TurnAbortedError

    async with harness([Reply.hang(after_text="busy")]) as h:
        h.agent.followup("keep busy")
        outcome: list[BaseException] = []

        async def caller() -> None:
            try:
                await h.agent.run("queued")
            except BaseException as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.sleep(1)
            h.agent.cancel(keep_inbox=True)  # the queued message stays, its wake is dropped
            await h.agent.wait_idle()
            assert [m["id"] for m in h.agent.inbox.next_turn] == ["m-2"]
            h.agent.inbox.claim("next-turn")  # a hand-made claim, no turn open
            with trio.fail_after(60):
                while not outcome:
                    await trio.sleep(1)
        [error] = outcome
        assert isinstance(error, TurnAbortedError)
        assert error.result is None


# -- continuations keep what the turn asked for ------------------------------------------------
@attrs.frozen
class Verdict:
    ok: bool


async def test_a_structured_output_turn_still_requires_its_type_after_approval(
    autojump_clock: Any,
) -> None:
    replies = [
        Reply.tool_calls(("delete", {"path": "a"}, "c1")),
        Reply.text("plain text is not the answer"),
        Reply.tool_calls(("final_result", {"ok": True}, "f1")),
    ]
    async with harness(replies, tools=[delete]) as h:
        first = await h.agent.run("go", output_type=Verdict)
        assert first.reason["kind"] == "awaiting-approval"
        result = await h.agent.resolve_approvals({"c1": True})
        assert result.output == Verdict(ok=True)
        assert RAN == ["delete a"]
        # the continuation offered final_result and steered the plain-text answer
        assert "final_result" in [t["name"] for t in h.model.requests[1].tools]
        assert len(h.model.requests) == 3
        assert_well_formed(h.events)


async def test_calls_carried_into_a_continuation_count_against_the_turn_budget(
    autojump_clock: Any,
) -> None:
    from dsh_agent_loop import TurnBudget

    options = attrs.evolve(OPTIONS, turn_budget=TurnBudget(max_tool_calls=2))
    replies = [
        Reply.tool_calls(("delete", {"path": "a"}, "c1"), ("delete", {"path": "b"}, "c2")),
        Reply.tool_calls(("look", {"path": "c"}, "c3")),  # a third call of the continuation
        Reply.text("never"),
    ]
    async with harness(replies, tools=[delete, look], options=options) as h:
        await h.run()
        h.agent.approve("c1")
        h.agent.approve("c2")
        await h.agent.wait_idle()
        assert sorted(RAN) == ["delete a", "delete b"]  # the carried calls ran: 2 of 2
        assert turn_ends(h.events)[-1] == {
            "kind": "aborted",
            "cause": "hook",
            "message": "turn budget: maxToolCalls 2 exceeded",
        }
        assert results(h.events)["c3"][1] == "ABORTED_BEFORE_DISPATCH"
        assert len(h.model.requests) == 2
        assert_well_formed(h.events)


async def test_approved_calls_run_in_the_parallel_pool_and_behind_exclusive_barriers(
    autojump_clock: Any,
) -> None:
    log: list[tuple[str, str, float]] = []

    @tool(requires_approval=True)
    async def slow(name: str) -> str:
        """Parallel, slow."""
        log.append(("start", name, trio.current_time()))
        await trio.sleep(10)
        log.append(("end", name, trio.current_time()))
        return name

    @tool(requires_approval=True, execution_mode="exclusive")
    async def solo(name: str) -> str:
        """Exclusive."""
        log.append(("start", name, trio.current_time()))
        await trio.sleep(1)
        log.append(("end", name, trio.current_time()))
        return name

    calls = [("slow", {"name": n}, n) for n in ("p1", "p2", "p3")]
    calls.append(("solo", {"name": "x"}, "x"))
    calls.append(("slow", {"name": "p4"}, "p4"))
    replies = [Reply.tool_calls(*calls), Reply.text("done")]
    async with harness(replies, tools=[slow, solo], max_parallel_tool_calls=2) as h:
        await h.run()
        result = await h.agent.resolve_approvals({c[2]: True for c in calls})
        assert result.text == "done"
    starts = {name: t for kind, name, t in log if kind == "start"}
    ends = {name: t for kind, name, t in log if kind == "end"}
    assert starts["p1"] == starts["p2"] < starts["p3"]  # two at once, the pool of 2
    assert starts["p3"] == min(ends["p1"], ends["p2"])
    assert starts["x"] == max(ends["p1"], ends["p2"], ends["p3"])
    assert starts["p4"] == ends["x"]  # held back by the exclusive call
    assert [c.call_id for c in result.tool_calls] == ["p1", "p2", "p3", "x", "p4"]
    assert_well_formed(h.events)
