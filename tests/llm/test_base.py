"""Model-call shapes (``llm/_base.py``): ``Failure``, ``Usage``, requests and chunk builders."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dsh_agent_loop._errors import AgentLoopError
from dsh_agent_loop._frozen import FrozenDict, freeze
from dsh_agent_loop.llm._base import (
    BlockStart,
    Chunk,
    Failure,
    Finish,
    ModelAdapter,
    ModelError,
    ModelRequest,
    PreparedCall,
    TextDelta,
    Usage,
    make_request,
    make_tool_call_start,
    make_usage,
)


def test_failure_to_data_leaves_out_what_is_unknown():
    assert Failure("TIMEOUT", "slow").to_data() == {"code": "TIMEOUT", "message": "slow"}
    assert Failure("HTTP_429", "later", status=429, retry_after=2.5).to_data() == {
        "code": "HTTP_429",
        "message": "later",
        "status": 429,
        "retry_after": 2.5,
    }
    assert Failure("X", "m", retry_after=0.0).to_data()["retry_after"] == 0.0


def test_model_error_carries_its_failure_code_and_message():
    failure = Failure("AUTH", "no key", status=401)
    exc = ModelError(failure)
    assert isinstance(exc, AgentLoopError)
    assert exc.failure is failure
    assert exc.code == "AUTH"
    assert exc.message == "no key"


def test_usage_to_data_and_make_usage():
    assert Usage().to_data() == {"input_tokens": 0, "output_tokens": 0}
    assert Usage(1, 2, cache_read_tokens=0, reasoning_tokens=5).to_data() == {
        "input_tokens": 1,
        "output_tokens": 2,
        "cache_read_tokens": 0,
        "reasoning_tokens": 5,
    }
    made = make_usage(3, 4)
    assert made == Usage(3, 4)
    assert (made.cache_read_tokens, made.reasoning_tokens) == (None, None)


def test_model_request_freezes_and_reads_its_config():
    request = ModelRequest(
        config={"provider": "openai", "model": "gpt", "reasoning_effort": "low", "max_tokens": "9"},
        messages=[freeze({"role": "user", "content": "hi"})],
        tools=[{"name": "t", "description": "", "parameters": {}}],
    )
    assert type(request.config) is FrozenDict
    assert type(request.tools) is tuple
    assert request.tools == ({"name": "t", "description": "", "parameters": {}},)
    assert (request.provider, request.model) == ("openai", "gpt")
    assert request.reasoning_effort == "low"
    assert request.max_tokens == 9


def test_model_request_defaults_when_the_config_is_sparse():
    request = ModelRequest(config={}, messages=())
    assert (request.provider, request.model) == ("", "")
    assert request.reasoning_effort is None
    assert request.max_tokens is None
    assert request.tools == ()


def test_make_request_builds_the_same_request_from_frozen_parts():
    config = freeze({"provider": "p", "model": "m"})
    messages = (freeze({"role": "user", "content": "x"}),)
    tools = (freeze({"name": "t"}),)
    made = make_request(config, messages, tools)
    assert made == ModelRequest(config=config, messages=messages, tools=tools)
    assert made.config is config
    assert made.messages is messages


def test_make_tool_call_start_is_a_tool_call_block_start():
    start = make_tool_call_start(2, "call-1", "search")
    assert start == BlockStart(index=2, kind="tool-call", call_id="call-1", name="search")
    assert start.type == "block-start"


def test_chunk_types_are_class_level_tags():
    assert TextDelta(0, "x").type == "text-delta"
    assert Finish("stop").type == "finish"
    assert Finish("error", failure=Failure("X", "y")).failure.code == "X"


async def test_prepared_call_streams_through_its_function_and_freezes_its_config():
    seen: list[ModelRequest] = []

    async def stream_fn(request: ModelRequest) -> AsyncIterator[Chunk]:
        seen.append(request)
        yield TextDelta(0, "hi")
        yield Finish("stop")

    call = PreparedCall(config={"model": "m"}, stream_fn=stream_fn)
    assert type(call.config) is FrozenDict
    assert call.adapter_defaults == {}
    assert (call.context_window, call.system_prompt_update) == (None, None)
    request = ModelRequest(config=call.config, messages=())
    chunks = [chunk async for chunk in call.stream(request)]
    assert chunks == [TextDelta(0, "hi"), Finish("stop")]
    assert seen == [request]


def test_model_adapter_is_a_runtime_checkable_protocol():
    class Adapter:
        async def prepare_call(self, config):  # pragma: no cover
            raise NotImplementedError

        async def aclose(self) -> None:  # pragma: no cover
            pass

    class NotAnAdapter:
        pass

    assert isinstance(Adapter(), ModelAdapter)
    assert not isinstance(NotAnAdapter(), ModelAdapter)


def test_frozen_shapes_refuse_changes():
    with pytest.raises(AttributeError):
        Failure("A", "b").code = "C"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        Usage().input_tokens = 1  # type: ignore[misc]
