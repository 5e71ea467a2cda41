"""Helpers for agent-level tests over the loopback server: SSE frame builders, a runtime with
one agent on a real HTTP adapter, and log queries."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from dsh_agent_loop import AgentOptions, Event, MemoryStore, Retry, invariants, open_runtime
from dsh_agent_loop.llm._anthropic import AnthropicAdapter
from dsh_agent_loop.llm._base import TRANSIENT_CODES
from dsh_agent_loop.llm._openai import OpenAIAdapter

from .server import LoopbackServer, Reply, open_loopback_server

KEY_ENV = "TEST_AGENT_LLM_KEY"
"""The env var the openai adapter of these tests reads its key from."""
CLAUDE_KEY_ENV = "TEST_AGENT_CLAUDE_KEY"
"""The env var the anthropic adapter of these tests reads its key from."""
TURN_TIMEOUT = 20.0
"""Real seconds a turn may take before the test fails instead of hanging."""

# --- OpenAI-compatible frames ---------------------------------------------------------------

DONE = b"data: [DONE]\n\n"


def oai(delta: Mapping[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    """One ``chat.completion.chunk`` event."""
    body: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    body["choices"] = [{"index": 0, "delta": dict(delta or {}), "finish_reason": finish}]
    body.update(extra)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def oai_usage(prompt: int = 10, completion: int = 2) -> bytes:
    """The usage frame that follows the finish frame."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"


def oai_call(index: int, call_id: str | None, name: str | None, arguments: str) -> bytes:
    """A tool-call delta frame."""
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "function": function}
    if call_id is not None:
        call["id"] = call_id
    return oai({"tool_calls": [call]})


def oai_text(*words: str, prompt: int = 10, completion: int = 2) -> list[bytes]:
    """The events of a whole answer made of ``words`` (finish ``stop``, usage, ``[DONE]``)."""
    first, *rest = words
    return [
        oai({"role": "assistant", "content": first}),
        *(oai({"content": w}) for w in rest),
        oai({}, "stop"),
        oai_usage(prompt, completion),
        DONE,
    ]


# --- Anthropic frames -----------------------------------------------------------------------


def an(kind: str, **payload: Any) -> bytes:
    """One Messages-API stream event."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


def an_start(input_tokens: int = 9) -> bytes:
    """``message_start`` with the input usage."""
    message = {
        "id": "msg",
        "type": "message",
        "role": "assistant",
        "content": [],
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return an("message_start", message=message)


def an_text_block(index: int, *parts: str) -> list[bytes]:
    """A text block streamed as ``parts`` (start and deltas, no stop)."""
    return [
        an("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *(
            an("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
            for p in parts
        ),
    ]


def an_end(stop_reason: str = "end_turn", output_tokens: int = 3) -> list[bytes]:
    """``message_delta`` with the stop reason, then ``message_stop``."""
    return [
        an(
            "message_delta",
            delta={"stop_reason": stop_reason},
            usage={"output_tokens": output_tokens},
        ),
        an("message_stop"),
    ]


def an_text(*parts: str, input_tokens: int = 9, output_tokens: int = 3) -> list[bytes]:
    """The events of a whole text answer."""
    return [
        an_start(input_tokens),
        *an_text_block(0, *parts),
        an("content_block_stop", index=0),
        *an_end("end_turn", output_tokens),
    ]


# --- log queries ----------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """Frozen event data as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


def types(events: Iterable[Event]) -> list[str]:
    """Event types in log order."""
    return [e.type for e in events]


def of_type(events: Iterable[Event], *wanted: str) -> list[Event]:
    """The events of the given types, in log order."""
    return [e for e in events if e.type in wanted]


def turn_events(events: Sequence[Event], turn: int) -> list[Event]:
    """The events of turn ``turn``, from its ``turn/start`` to its ``turn/end``, inclusive."""
    out: list[Event] = []
    inside = False
    for event in events:
        if event.type == "turn/start" and event.data["turn"] == turn:
            inside = True
        if inside:
            out.append(event)
            if event.type == "turn/end":
                break
    return out


def turn_ends(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The ``reason`` of every ``turn/end``, plain."""
    return [plain(e.data["reason"]) for e in events if e.type == "turn/end"]


def assert_well_formed(events: Sequence[Event]) -> None:
    """``invariants.check`` finds nothing, and no turn is left open."""
    violations = invariants.check(events, allow_open_turn=False)
    assert violations == [], [str(v) for v in violations]


def call_ids(events: Iterable[Event]) -> list[str]:
    """Every tool-call id of every stored ``assistant/message``, in order."""
    return [
        block["call_id"]
        for event in events
        if event.type == "assistant/message"
        for block in event.data["message"]["content"]
        if block["type"] == "tool-call"
    ]


async def fast_transient_retry(payload: Any, next: Any) -> Any:
    """``agent/request-error`` listener: retry transient codes at once, else the default."""
    if payload["failure"].code in TRANSIENT_CODES:
        return Retry(delay=0)
    return await next(payload)


# --- a runtime with one agent on a real HTTP adapter ----------------------------------------


@attrs.define
class LiveAgent:
    """A runtime, one agent, and the loopback server its provider talks to."""

    server: LoopbackServer
    rt: Any
    handle: Any
    adapter: Any

    @property
    def agent(self) -> Any:
        return self.handle.agent

    @property
    def events(self) -> list[Event]:
        return list(self.agent.session.events)

    def of_type(self, *wanted: str) -> list[Event]:
        return of_type(self.events, *wanted)

    def turn(self, n: int) -> list[Event]:
        return turn_events(self.events, n)

    def bodies(self) -> list[Any]:
        """The JSON bodies of the requests the server received, in order."""
        return [r.json() for r in self.server.requests]

    async def run(self, message: Any = "go", *, limit: float = TURN_TIMEOUT) -> str:
        """Follow up with ``message`` and wait (bounded, real time) until the agent is idle."""
        message_id = self.agent.followup(message)
        with trio.fail_after(limit):
            await self.agent.wait_idle()
        return message_id


def make_adapter(kind: str, base_url: str, **kwargs: Any) -> Any:
    """An ``openai`` (key from ``KEY_ENV``) or ``anthropic`` (``CLAUDE_KEY_ENV``) adapter."""
    if kind == "openai":
        kwargs.setdefault("api_key_env", KEY_ENV)
        return OpenAIAdapter("live", base_url=base_url, **kwargs)
    kwargs.setdefault("api_key_env", CLAUDE_KEY_ENV)
    return AnthropicAdapter("live", base_url=base_url, **kwargs)


MODELS = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-20250514"}


@asynccontextmanager
async def live_agent(
    kind: str = "openai",
    *,
    model: str | None = None,
    default: Reply | None = None,
    tools: Sequence[Any] = (),
    adapter_kwargs: Mapping[str, Any] | None = None,
    extra_providers: Mapping[str, Any] | None = None,
    provider: str = "live",
    options: Mapping[str, Any] | None = None,
    **runtime_kwargs: Any,
) -> AsyncIterator[LiveAgent]:
    """Serve on loopback, open a runtime whose provider ``live`` posts there, create ``main``."""
    async with open_loopback_server(default) as server:
        adapter = make_adapter(kind, server.url, **dict(adapter_kwargs or {}))
        providers = {"live": adapter, **dict(extra_providers or {})}
        runtime_kwargs.setdefault("store", MemoryStore())
        runtime_kwargs.setdefault("seed", 0)
        async with open_runtime(providers=providers, tools=tools, **runtime_kwargs) as rt:
            opts = AgentOptions(
                id="main", provider=provider, model=model or MODELS[kind], **dict(options or {})
            )
            handle = await rt.agents.create(options=opts)
            yield LiveAgent(server, rt, handle, adapter)


def sse_events(data: bytes) -> list[bytes]:
    """``data`` (a transcript) split into its events, each with its blank-line terminator."""
    return [part + b"\n\n" for part in data.split(b"\n\n") if part.strip()]
