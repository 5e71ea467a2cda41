"""Tests for dsh_agent_loop._tools.loader: ``package.module:attr`` tool references."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from dsh_agent_loop._tools.base import Tool
from dsh_agent_loop._tools.loader import ToolRefError, is_tool_ref, load_tool_ref

_MODULE = """
from dsh_agent_loop import tool

@tool
async def shout(text: str) -> str:
    \"\"\"Upper-case the text.\"\"\"
    return text.upper()

@tool(execution_mode="exclusive")
async def whisper(text: str) -> str:
    \"\"\"Lower-case the text.\"\"\"
    return text.lower()

ALL = [shout, whisper]
MIXED = (shout, len)
EMPTY = []
NOT_A_TOOL = 42

async def plain(text: str) -> str:
    return text

class Box:
    tools = (whisper,)
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real module on sys.path, named uniquely per test."""
    name = f"usertools_{tmp_path.name.replace('-', '_')}"
    package = tmp_path / "pkg_root" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "tools.py").write_text(textwrap.dedent(_MODULE), encoding="utf-8")
    (package / "broken.py").write_text("raise RuntimeError('boom at import')\n", "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg_root"))
    return name


def test_a_decorated_function_is_one_tool(module: str) -> None:
    (shout,) = load_tool_ref(f"{module}.tools:shout")
    assert isinstance(shout, Tool)
    assert (shout.name, shout.description) == ("shout", "Upper-case the text.")


async def test_the_loaded_tool_is_the_module_s_own_and_runs(module: str) -> None:
    (shout,) = load_tool_ref(f"{module}.tools:shout")
    assert await shout.handler({"text": "hi"}, None) == "HI"  # type: ignore[arg-type]


def test_a_sequence_gives_its_tools_in_order(module: str) -> None:
    tools = load_tool_ref(f"{module}.tools:ALL")
    assert [t.name for t in tools] == ["shout", "whisper"]
    assert tools[1].execution_mode == "exclusive"


def test_a_dotted_attribute_is_followed(module: str) -> None:
    assert [t.name for t in load_tool_ref(f"{module}.tools:Box.tools")] == ["whisper"]


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("NOT_A_TOOL", "'NOT_A_TOOL' is of type int, not a Tool"),
        ("plain", "'plain' is of type function, not a Tool or a sequence of tools"),
        ("MIXED", "item 1 is builtin_function_or_method, not a Tool"),
        ("EMPTY", "'EMPTY' is an empty sequence"),
        ("missing", "has no attribute 'missing'"),
    ],
)
def test_a_value_that_is_not_a_tool_is_refused(module: str, attr: str, message: str) -> None:
    with pytest.raises(ToolRefError, match=re.escape(message)) as info:
        load_tool_ref(f"{module}.tools:{attr}")
    assert f"{module}.tools:{attr}" in str(info.value)


def test_an_import_failure_names_the_module(module: str) -> None:
    with pytest.raises(ToolRefError, match=r"cannot import 'no_such_pkg_xyz\.mod'"):
        load_tool_ref("no_such_pkg_xyz.mod:thing")


def test_a_module_that_raises_while_importing_is_a_tool_ref_error(module: str) -> None:
    with pytest.raises(ToolRefError, match="RuntimeError: boom at import"):
        load_tool_ref(f"{module}.broken:x")


@pytest.mark.parametrize("ref", ["json", "json:", ":dumps", "not a module:x", "a..b:c"])
def test_a_malformed_reference_is_refused(ref: str) -> None:
    with pytest.raises(ToolRefError, match=r"expected 'package\.module:attribute'"):
        load_tool_ref(ref)


def test_tool_ref_error_is_a_value_error() -> None:
    assert issubclass(ToolRefError, ValueError)


def test_is_tool_ref_tells_references_from_names() -> None:
    assert is_tool_ref("pkg.mod:attr")
    assert not is_tool_ref("read_file")
