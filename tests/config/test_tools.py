"""Tests for dsh_agent_loop.config._tools: ``tools`` lists in a config, checked when it loads.

``dsh_agent_loop.load_config`` (and ``open_runtime``) check them with the composition's tool
catalog, which imports each reference; ``dsh_agent_loop.config.load_config`` alone does not.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import attrs
import pytest
import trio
import yaml

from dsh_agent_loop import Reply, ScriptedModel, load_config, open_runtime, tool
from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop.config import converter
from dsh_agent_loop.config import load_config as config_load
from dsh_agent_loop.llm._base import ModelRequest

from .helpers import P0, config_with, error_of

_MODULE = """
from dsh_agent_loop import tool

@tool
async def shout(text: str) -> str:
    \"\"\"Upper-case the text.\"\"\"
    return text.upper()

@tool
async def whisper(text: str) -> str:
    \"\"\"Lower-case the text.\"\"\"
    return text.lower()

BOTH = [shout, whisper]
NUMBER = 7
"""


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a real module on sys.path holding ``shout``, ``whisper`` and ``BOTH``."""
    name = f"cfgtools_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / "src"
    root.mkdir()
    (root / f"{name}.py").write_text(textwrap.dedent(_MODULE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    return name


def _offered(request: ModelRequest) -> list[str]:
    return sorted(t["name"] for t in request.tools)


def test_references_and_builtin_names_load(mod: str) -> None:
    config = load_config(
        config_with({"id": "a", "tools": ["read_file", f"{mod}:shout"]}, tools=[f"{mod}:BOTH"])
    )
    assert config.plugin.tools == (f"{mod}:BOTH",)
    assert config.agents[0].tools == ("read_file", f"{mod}:shout")


@pytest.mark.parametrize(
    ("agent_tools", "message"),
    [
        (["read_file", "{mod}:nothing"], "has no attribute 'nothing'"),
        (["read_file", "{mod}:NUMBER"], "'NUMBER' is of type int, not a Tool"),
        (["read_file", "no_such_module_q:x"], "cannot import 'no_such_module_q'"),
        (["read_file", "grep"], "unknown tool 'grep' (built-ins: read_file, list_dir,"),
        (["read_file", "read_file"], "tool 'read_file' is given twice (also tools[0])"),
    ],
)
def test_a_bad_agent_tool_is_a_config_error_at_its_key_path(
    mod: str, agent_tools: list[str], message: str
) -> None:
    raw = config_with({"id": "x"}, {"id": "a", "tools": [t.format(mod=mod) for t in agent_tools]})
    error = error_of(raw)
    assert error.startswith(f"<config>: {P0}.agents[1].tools[1]: ")
    assert message in error


def test_a_bad_runtime_tool_is_a_config_error_at_its_key_path(mod: str) -> None:
    error = error_of(config_with(tools=[f"{mod}:BOTH", f"{mod}:missing"]))
    assert error.startswith(f"<config>: {P0}.tools[1]: tool reference '{mod}:missing'")


def test_a_tool_given_twice_by_references_is_refused(mod: str) -> None:
    error = error_of(config_with(tools=[f"{mod}:BOTH", f"{mod}:shout"]))
    assert error == f"<config>: {P0}.tools[1]: tool 'shout' is given twice (also tools[0])"


def test_an_agent_may_name_runtime_tools_of_the_config_and_of_open_runtime(mod: str) -> None:
    raw = config_with({"id": "a", "tools": ["whisper", "mine"]}, tools=[f"{mod}:BOTH"])
    with pytest.raises(ConfigError, match=r"agents\[0\]\.tools\[1\]: unknown tool 'mine'"):
        load_config(raw)
    assert load_config(raw, known_tools=["mine"]).agents[0].tools == ("whisper", "mine")


def test_a_yaml_file_with_a_bad_reference_fails_at_load_naming_file_and_path(
    mod: str, tmp_path: Path
) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(config_with({"id": "a", "tools": [f"{mod}:nope"]})), "utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {P0}.agents[0].tools[0]: tool reference")


async def test_open_runtime_refuses_a_bad_reference_before_any_agent_starts(mod: str) -> None:
    model = ScriptedModel([Reply.text("never")])
    raw = config_with({"id": "a", "provider": "s", "tools": [f"{mod}:nope"]})
    with pytest.raises(ConfigError, match=r"agents\[0\]\.tools\[0\]"):
        async with open_runtime(raw, providers={"s": model}):
            pytest.fail("the runtime opened")  # pragma: no cover
    assert model.requests == []


async def test_runtime_level_references_are_runtime_tools_every_agent_sees(mod: str) -> None:
    model = ScriptedModel(
        [Reply.tool_calls(("shout", {"text": "hi"})), Reply.text("done")], latency=0.0
    )
    raw = config_with({"id": "a", "provider": "s", "model": "m"}, tools=[f"{mod}:BOTH", "list_dir"])
    async with open_runtime(raw, providers={"s": model}) as rt:
        assert sorted(rt.tools) == ["list_dir", "shout", "whisper"]
        agent = rt.agents.get("a")
        assert agent is not None
        agent.followup("go")
        with trio.fail_after(5):
            await agent.wait_idle()
        (result,) = [e for e in agent.session.events if e.type == "tool/result"]
    assert [part["text"] for part in result.data["message"]["content"]] == ["HI"]
    assert _offered(model.requests[0]) == ["list_dir", "shout", "whisper"]


async def test_an_agent_s_references_are_its_own(mod: str) -> None:
    own = ScriptedModel([Reply.text("a")], latency=0.0)
    other = ScriptedModel([Reply.text("b")], latency=0.0)
    raw = config_with(
        {"id": "a", "provider": "own", "model": "m", "tools": ["read_file", f"{mod}:shout"]},
        {"id": "b", "provider": "other", "model": "m"},
    )

    @tool
    async def given(text: str) -> str:
        """A tool given to open_runtime."""
        return text

    async with open_runtime(raw, providers={"own": own, "other": other}, tools=[given]) as rt:
        a, b = rt.agents.get("a"), rt.agents.get("b")
        assert a is not None
        assert b is not None
        assert a.options.tools == ("read_file",)
        for agent in (a, b):
            agent.followup("go")
            with trio.fail_after(5):
                await agent.wait_idle()
    assert _offered(own.requests[0]) == ["read_file", "shout"]
    assert _offered(other.requests[0]) == ["given"]


async def test_explicit_tools_win_over_config_tools_of_the_same_name(mod: str) -> None:
    @tool
    async def shout(text: str) -> str:
        """Explicit."""
        return text

    raw = config_with(tools=[f"{mod}:shout"])
    async with open_runtime(raw, tools=[shout]) as rt:
        assert rt.tools["shout"] is shout


def test_a_runtime_config_round_trips_with_its_tools(mod: str) -> None:
    config = load_config(config_with({"id": "a", "tools": [f"{mod}:shout"]}, tools=["read_file"]))
    raw = converter.unstructure(config)
    assert raw["plugins"][0]["config"]["tools"] == ["read_file"]
    assert load_config(raw) == config


@attrs.frozen
class _FakeCatalog:
    """A catalog of two built-ins whose references name tools by their attribute."""

    builtin: tuple[str, ...] = ("look", "poke")
    asked: list[str] = attrs.field(factory=list)

    def names(self, ref: str) -> tuple[str, ...]:
        self.asked.append(ref)
        module, _, attr = ref.partition(":")
        if module != "fake":
            raise ValueError(f"tool reference {ref!r}: no such module")
        return tuple(attr.split("+"))


def test_the_config_package_checks_tool_lists_with_the_catalog_it_is_handed() -> None:
    catalog = _FakeCatalog()
    raw = config_with(
        {"id": "a", "tools": ["look", "fake:x+y", "x", "real:z", "nope"]},
        tools=["poke", "fake:x"],
    )
    with pytest.raises(ConfigError) as info:
        config_load(raw, tool_catalog=catalog)
    assert str(info.value).split("; <config>: ") == [
        f"<config>: {P0}.agents[0].tools[2]: tool 'x' is given twice (also tools[1])",
        f"{P0}.agents[0].tools[3]: tool reference 'real:z': no such module",
        f"{P0}.agents[0].tools[4]: unknown tool 'nope' (built-ins: look, poke; "
        "or write 'package.module:attribute')",
    ]
    assert catalog.asked == ["fake:x", "fake:x+y", "real:z"]
    assert config_load(raw).agents[0].tools == ("look", "fake:x+y", "x", "real:z", "nope")
