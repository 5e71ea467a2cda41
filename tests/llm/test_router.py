"""``ModelRouter`` (``llm/_router.py``): routing by provider name, ``NO_ADAPTER``, closing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from dsh_agent_loop.llm._base import Chunk, Failure, ModelError, ModelRequest, PreparedCall
from dsh_agent_loop.llm._router import ModelRouter


async def _no_chunks(request: ModelRequest) -> AsyncIterator[Chunk]:  # pragma: no cover
    return
    yield


class FakeAdapter:
    def __init__(self, name: str) -> None:
        self.name = name
        self.configs: list[Mapping[str, Any]] = []
        self.closed = 0

    async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
        self.configs.append(config)
        return PreparedCall(config={**config, "served_by": self.name}, stream_fn=_no_chunks)

    async def aclose(self) -> None:
        self.closed += 1


class NoClose:
    async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
        return PreparedCall(config=config, stream_fn=_no_chunks)


async def test_a_config_goes_to_the_adapter_of_its_provider():
    a, b = FakeAdapter("a"), FakeAdapter("b")
    router = ModelRouter({"openai": a, "anthropic": b})
    call = await router.prepare_call({"provider": "anthropic", "model": "m"})
    assert call.config["served_by"] == "b"
    assert b.configs == [{"provider": "anthropic", "model": "m"}]
    assert a.configs == []


@pytest.mark.parametrize("config", [{"provider": "nowhere"}, {"model": "m"}, {"provider": None}])
async def test_an_unrouted_provider_fails_with_no_adapter(config):
    router = ModelRouter({"openai": FakeAdapter("a")})
    with pytest.raises(ModelError) as info:
        await router.prepare_call(config)
    assert info.value.code == "NO_ADAPTER"
    assert info.value.failure == Failure(
        "NO_ADAPTER", f"no adapter is registered for provider {config.get('provider')!r}"
    )


async def test_a_non_string_provider_is_looked_up_by_its_text():
    router = ModelRouter({"7": FakeAdapter("seven")})
    call = await router.prepare_call({"provider": 7})
    assert call.config["served_by"] == "seven"


async def test_an_adapter_error_propagates_unchanged():
    failure = Failure("AUTH", "no key")

    class Refusing:
        async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
            raise ModelError(failure)

    router = ModelRouter({"p": Refusing()})
    with pytest.raises(ModelError) as info:
        await router.prepare_call({"provider": "p"})
    assert info.value.failure is failure


def test_register_get_and_names():
    first, second = FakeAdapter("1"), FakeAdapter("2")
    router = ModelRouter()
    assert router.names == ()
    assert router.get("x") is None
    router.register("x", first)
    router.register("y", second)
    router.register("x", second)  # replaces
    assert router.get("x") is second
    assert router.names == ("x", "y")


def test_the_router_copies_the_mapping_it_is_given():
    adapters = {"a": FakeAdapter("a")}
    router = ModelRouter(adapters)
    adapters["b"] = FakeAdapter("b")
    assert router.names == ("a",)


async def test_aclose_closes_each_adapter_once_and_skips_those_without_aclose():
    shared, other = FakeAdapter("s"), FakeAdapter("o")
    router = ModelRouter({"one": shared, "two": shared, "three": other, "plain": NoClose()})
    await router.aclose()
    assert (shared.closed, other.closed) == (1, 1)
