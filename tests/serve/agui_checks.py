"""What the AG-UI tests share: the protocol's own parse of each event, SSE frames, order checks.

Every event a test sees is re-parsed with ``ag_ui.core``'s ``Event`` union (a pydantic
``TypeAdapter``), so a field the protocol does not allow fails there, and the stream as a whole
is checked for the protocol's ordering rules: one ``RUN_STARTED`` first, one terminal event
last, every message and tool call started before its content and ended after it, every result
naming a call that was made, every step finished (docs/design.md#ag-ui). ``session_log`` runs a
real agent in-process on the scripted model for the translation tests; ``run_of`` translates
one run of its log.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ag_ui.core import BaseEvent, Event
from ag_ui.encoder import EventEncoder
from ag_ui_validate.pytest_plugin import assert_valid_agui
from pydantic import TypeAdapter

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, open_runtime
from dsh_agent_loop import Event as LogEvent
from dsh_agent_loop._serve.agui_translate import Continuation, agui_message_id, translate_run

EVENT: TypeAdapter[Any] = TypeAdapter(Event)
TERMINAL = ("RUN_FINISHED", "RUN_ERROR")
THREAD = "s-agui"
FULL_RUN = [
    "RUN_STARTED",
    "STEP_STARTED",
    "REASONING_START",
    "REASONING_MESSAGE_START",
    "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_END",
    "REASONING_END",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "STEP_FINISHED",
    "STEP_STARTED",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "STEP_FINISHED",
    "RUN_FINISHED",
]
LOOK = Reply.tool_calls(
    ("list_dir", {"path": "."}), text="Let me look.", reasoning="I should list the folder."
)


def conformant(events: Sequence[dict[str, Any]]) -> None:
    """The conformance validator finds no error and no warning."""
    assert_valid_agui(list(events), max_warnings=0)


async def session_log(
    cwd: Path, replies: Sequence[Reply], prompts: Sequence[str], **options: Any
) -> list[LogEvent]:
    """A real agent's log: each prompt sent as message ``agui-<prompt>``, one turn at a time."""
    model = ScriptedModel(list(replies))
    async with open_runtime(providers={"scripted": model}, seed=1) as rt:
        handle = await rt.agents.create(
            session_id=THREAD,
            options=AgentOptions(
                id="helper", provider="scripted", model="m", cwd=str(cwd), **options
            ),
        )
        for prompt in prompts:
            handle.agent.followup(prompt, message_id=agui_message_id(prompt))
            await handle.agent.wait_idle()
        return list(handle.agent.session.events)


def run_of(
    events: Sequence[LogEvent], prompt: str, claim: Continuation | None = None
) -> list[dict[str, Any]]:
    """The AG-UI events of run ``prompt``, through the encoder and parsed back.

    The run sent message ``agui-<prompt>``, or resumed ``claim``.
    """
    claimed = agui_message_id(prompt) if claim is None else claim
    return encoded(translate_run(events, thread_id=THREAD, run_id=prompt, claim=claimed))


def parse(payload: str) -> dict[str, Any]:
    """One event's JSON, validated by the protocol's models; the wire form (camelCase) back."""
    model = EVENT.validate_json(payload)
    assert isinstance(model, BaseEvent)
    wire = json.loads(payload)
    assert model.model_dump(mode="json", by_alias=True) == wire, wire
    return dict(wire)


def encoded(events: Iterable[BaseEvent]) -> list[dict[str, Any]]:
    """``events`` through the protocol's SSE encoder, each frame parsed back."""
    encoder = EventEncoder()
    out = []
    for event in events:
        frame = encoder.encode(event)
        assert frame.startswith("data: "), frame
        assert frame.endswith("\n\n"), frame
        out.append(parse(frame[len("data: ") : -2]))
    return out


def sse_payloads(text: str) -> tuple[list[str], int]:
    """The ``data:`` payloads of an SSE body, and how many comment lines it had."""
    payloads: list[str] = []
    comments = 0
    for frame in text.split("\n\n"):
        data = []
        for line in frame.split("\n"):
            if line.startswith(":"):
                comments += 1
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            else:
                assert line == "", f"unexpected SSE line {line!r}"
        if data:
            payloads.append("\n".join(data))
    return payloads, comments


def types(events: Sequence[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def _pairs(events: Sequence[dict[str, Any]], key: str, start: str, middle: str, end: str) -> None:
    """Per ``key`` value: one ``start``, then its ``middle`` events, then one ``end``."""
    state: dict[str, str] = {}
    for e in events:
        if e["type"] == start:
            assert e[key] not in state, f"{start} twice for {e[key]}"
            state[e[key]] = "open"
        elif e["type"] == middle:
            assert state.get(e[key]) == "open", f"{middle} outside {start}..{end}: {e}"
        elif e["type"] == end:
            assert state.get(e[key]) == "open", f"{end} without {start}: {e}"
            state[e[key]] = "closed"
    assert all(v == "closed" for v in state.values()), state


def check_run(events: Sequence[dict[str, Any]], thread_id: str, run_id: str) -> None:
    """The ordering rules of the module docstring."""
    assert events, "no event"
    first, last = events[0], events[-1]
    assert (first["type"], first["threadId"], first["runId"]) == ("RUN_STARTED", thread_id, run_id)
    assert types(events).count("RUN_STARTED") == 1
    assert last["type"] in TERMINAL
    assert sum(t in TERMINAL for t in types(events)) == 1
    if last["type"] == "RUN_FINISHED":
        assert (last["threadId"], last["runId"]) == (thread_id, run_id)
    _pairs(events, "messageId", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END")
    _pairs(
        events,
        "messageId",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
    )
    _pairs(events, "messageId", "REASONING_START", "-", "REASONING_END")
    _pairs(events, "toolCallId", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END")
    _pairs(events, "stepName", "STEP_STARTED", "-", "STEP_FINISHED")
    ended = set()
    for e in events:
        if e["type"] == "TOOL_CALL_END":
            ended.add(e["toolCallId"])
        elif e["type"] == "TOOL_CALL_RESULT":
            assert e["toolCallId"] in ended, f"result before its call ended: {e}"
        if e["type"] in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT", "TOOL_CALL_ARGS"):
            assert e["delta"], f"empty delta: {e}"
    ids = [
        e["messageId"] for e in events if e["type"] in ("TEXT_MESSAGE_START", "TOOL_CALL_RESULT")
    ]
    assert len(ids) == len(set(ids)), ids
