"""Tests for dsh_agent_loop._tools.builtin: each tool, and confinement to the agent's cwd."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop._sandbox import Sandbox, Workspace
from dsh_agent_loop._tools import builtin
from dsh_agent_loop._tools.base import DEFAULT_WORKSPACE, ToolContext, ToolResult, parse_arguments
from dsh_agent_loop._tools.builtin import BUILTIN_TOOLS, builtin_tool

from .test_sandbox import needs_bwrap

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shells and symlinks")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace, with a secret in it."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret\n", encoding="utf-8")
    return path


@pytest.fixture
def work(tmp_path: Path, outside: Path) -> Path:
    """The agent's cwd: files, a subdirectory, and symlinks that point out of it."""
    path = tmp_path / "work"
    (path / "src").mkdir(parents=True)
    (path / "README.md").write_text("# Title\nline two\nline three\n", encoding="utf-8")
    (path / "src" / "app.py").write_text("def main():\n    return 42  # TODO\n", encoding="utf-8")
    (path / "escape.txt").symlink_to(outside / "secret.txt")
    (path / "escape_dir").symlink_to(outside, target_is_directory=True)
    (path / "inner_link.md").symlink_to(path / "README.md")
    return path


#: Commands run as the user, unconfined (the sandbox's own tests are in test_sandbox.py).
UNCONFINED = Workspace(sandbox=Sandbox(mode="off"))


def ctx(cwd: Path | str | None, workspace: Workspace = DEFAULT_WORKSPACE) -> ToolContext:
    path = None if cwd is None else str(cwd)
    return ToolContext(
        agent_id="a", session_id="s", call_id="c-1", cwd=path, turn=1, step=1, workspace=workspace
    )


async def call(
    name: str, cwd: Path | None, workspace: Workspace = DEFAULT_WORKSPACE, **arguments: Any
) -> ToolResult:
    result = await builtin_tool(name).handler(arguments, ctx(cwd, workspace))
    return result if isinstance(result, ToolResult) else ToolResult(content=result)


def assert_ok(result: ToolResult) -> str:
    assert result.error is None, result.content
    assert not result.content.startswith("Error:")
    return result.content


def assert_error(result: ToolResult, code: str) -> str:
    assert result.error == code, result.content
    assert result.content.startswith("Error: ")
    return result.content


# --- registry ---------------------------------------------------------------------------------


def test_registry_and_execution_modes() -> None:
    modes = {name: tool.execution_mode for name, tool in BUILTIN_TOOLS.items()}
    assert modes == {
        "read_file": "parallel",
        "list_dir": "parallel",
        "search_text": "parallel",
        "write_file": "exclusive",
        "edit_file": "exclusive",
        "run_command": "exclusive",
    }
    assert builtin_tool("read_file") is BUILTIN_TOOLS["read_file"]
    with pytest.raises(KeyError, match="unknown built-in tool 'rm'"):
        builtin_tool("rm")
    with pytest.raises(TypeError):
        BUILTIN_TOOLS["x"] = BUILTIN_TOOLS["read_file"]  # type: ignore[index]


def test_schemas_validate_arguments() -> None:
    assert parse_arguments(builtin_tool("read_file"), '{"path": "a", "limit": 3}') == {
        "path": "a",
        "limit": 3,
    }
    assert parse_arguments(builtin_tool("list_dir"), "") == {"path": "."}
    with pytest.raises(ValueError, match="must be bigger than or equal to 1"):
        parse_arguments(builtin_tool("read_file"), '{"path": "a", "offset": 0}')
    with pytest.raises(ValueError, match="must not contain"):
        parse_arguments(builtin_tool("edit_file"), '{"path": "a", "old": "x", "new": "", "z": 1}')


# --- read_file --------------------------------------------------------------------------------


async def test_read_file(work: Path) -> None:
    assert assert_ok(await call("read_file", work, path="README.md")) == (
        "# Title\nline two\nline three\n"
    )
    assert assert_ok(await call("read_file", work, path="./src/../src/app.py")).startswith("def")
    absolute = str(work / "README.md")
    assert "line two" in assert_ok(await call("read_file", work, path=absolute))
    assert "line two" in assert_ok(await call("read_file", work, path="inner_link.md"))


async def test_read_file_window_and_truncation_marker(work: Path) -> None:
    (work / "long.txt").write_text("".join(f"{n}\n" for n in range(1, 11)), encoding="utf-8")
    assert assert_ok(await call("read_file", work, path="long.txt", offset=9)) == "9\n10\n"
    window = assert_ok(await call("read_file", work, path="long.txt", offset=3, limit=2))
    assert window == "3\n4\n[... truncated: lines 3-4 shown; read on with offset=5]"
    past = assert_ok(await call("read_file", work, path="long.txt", offset=50))
    assert past == "[offset 50 is past the end of the file, which has 10 lines]"
    (work / "empty.txt").write_text("", encoding="utf-8")
    assert assert_ok(await call("read_file", work, path="empty.txt")) == "(empty file)"


async def test_read_file_caps_characters(work: Path) -> None:
    line = "x" * 1000 + "\n"
    (work / "big.txt").write_text(line * 300, encoding="utf-8")
    text = assert_ok(await call("read_file", work, path="big.txt"))
    assert len(text) <= builtin.MAX_READ_CHARS + 200
    assert text.endswith("[... truncated: lines 1-99 shown; read on with offset=100]")


async def test_read_file_errors(work: Path) -> None:
    assert_error(await call("read_file", work, path="nope.txt"), "NOT_FOUND")
    assert_error(await call("read_file", work, path="src"), "NOT_A_FILE")
    assert_error(await call("read_file", work, path=""), "INVALID_ARGUMENTS")
    assert_error(await call("read_file", work, path="README.md", limit=0), "INVALID_ARGUMENTS")


# --- list_dir ---------------------------------------------------------------------------------


async def test_list_dir(work: Path) -> None:
    listing = assert_ok(await call("list_dir", work))
    assert listing.splitlines() == [
        "README.md",
        "escape.txt@",
        "escape_dir@",
        "inner_link.md@",
        "src/",
    ]
    assert assert_ok(await call("list_dir", work, path="src")) == "app.py"
    (work / "void").mkdir()
    assert assert_ok(await call("list_dir", work, path="void")) == "(void is empty)"
    assert_error(await call("list_dir", work, path="README.md"), "NOT_A_DIRECTORY")
    assert_error(await call("list_dir", work, path="missing"), "NOT_FOUND")


# --- search_text ------------------------------------------------------------------------------


async def test_search_text(work: Path) -> None:
    found = assert_ok(await call("search_text", work, pattern=r"line \w+"))
    assert found.splitlines() == [
        "README.md:2: line two",
        "README.md:3: line three",
        "inner_link.md:2: line two",
        "inner_link.md:3: line three",
    ]
    assert assert_ok(await call("search_text", work, pattern="TODO", path="src")) == (
        "src/app.py:2:     return 42  # TODO"
    )
    assert assert_ok(await call("search_text", work, pattern="TODO", path="src/app.py")) == (
        "src/app.py:2:     return 42  # TODO"
    )
    assert assert_ok(await call("search_text", work, pattern="zzz")) == "No matches."


async def test_search_text_limits_and_skips(work: Path) -> None:
    (work / "many.txt").write_text("hit\n" * 5, encoding="utf-8")
    limited = assert_ok(await call("search_text", work, pattern="hit", max_results=2))
    assert limited.splitlines() == [
        "many.txt:1: hit",
        "many.txt:2: hit",
        "[... stopped after 2 matches]",
    ]
    (work / ".git").mkdir()
    (work / ".git" / "config").write_text("needle\n", encoding="utf-8")
    (work / "blob.bin").write_bytes(b"needle\x00\x01")
    (work / "note.txt").write_text("needle\n", encoding="utf-8")
    assert assert_ok(await call("search_text", work, pattern="needle")) == "note.txt:1: needle"
    assert_error(await call("search_text", work, pattern="("), "INVALID_ARGUMENTS")


async def test_search_text_does_not_follow_links_out(work: Path) -> None:
    assert assert_ok(await call("search_text", work, pattern="secret")) == "No matches."
    assert_error(
        await call("search_text", work, pattern="secret", path="escape_dir"), "PATH_OUTSIDE_CWD"
    )


# --- write_file, edit_file --------------------------------------------------------------------


async def test_write_file(work: Path) -> None:
    created = assert_ok(await call("write_file", work, path="new/deep/f.txt", content="a\r\nb"))
    assert created == "Created new/deep/f.txt (4 characters)"
    assert (work / "new" / "deep" / "f.txt").read_bytes() == b"a\r\nb"
    again = assert_ok(await call("write_file", work, path="new/deep/f.txt", content="c"))
    assert again == "Overwrote new/deep/f.txt (1 characters)"
    assert (work / "new" / "deep" / "f.txt").read_text(encoding="utf-8") == "c"
    assert_error(await call("write_file", work, path="src", content="x"), "NOT_A_FILE")
    os.mkfifo(work / "fifo")
    assert_error(await call("write_file", work, path="fifo", content="x"), "NOT_A_FILE")
    assert_error(await call("read_file", work, path="fifo"), "NOT_A_FILE")
    assert assert_ok(await call("search_text", work, pattern="x", path="fifo")) == "No matches."
    assert_error(await call("write_file", work, path="a.txt"), "INVALID_ARGUMENTS")
    under_a_file = await call("write_file", work, path="README.md/x.txt", content="x")
    assert assert_error(under_a_file, "IO_ERROR") == "Error: File exists: 'README.md/x.txt'"


async def test_edit_file(work: Path) -> None:
    result = assert_ok(await call("edit_file", work, path="src/app.py", old="42", new="43"))
    assert result == "Edited src/app.py: replaced 1 occurrence at line 2"
    assert (work / "src" / "app.py").read_text(encoding="utf-8") == (
        "def main():\n    return 43  # TODO\n"
    )


async def test_edit_file_needs_exactly_one_occurrence(work: Path) -> None:
    before = (work / "README.md").read_text(encoding="utf-8")
    missing = assert_error(
        await call("edit_file", work, path="README.md", old="absent", new="x"), "EDIT_NO_MATCH"
    )
    assert missing == "Error: the old text was not found in 'README.md'"
    twice = assert_error(
        await call("edit_file", work, path="README.md", old="line t", new="x"), "EDIT_AMBIGUOUS"
    )
    assert twice == (
        "Error: the old text occurs 2 times in 'README.md'; include more surrounding text so "
        "that it matches exactly once"
    )
    (work / "aaa.txt").write_text("aaa", encoding="utf-8")
    assert_error(await call("edit_file", work, path="aaa.txt", old="aa", new="b"), "EDIT_AMBIGUOUS")
    assert_error(
        await call("edit_file", work, path="README.md", old="", new="x"), "INVALID_ARGUMENTS"
    )
    assert_error(await call("edit_file", work, path="gone.md", old="a", new="b"), "NOT_FOUND")
    assert (work / "README.md").read_text(encoding="utf-8") == before


# --- protected paths --------------------------------------------------------------------------


@pytest.fixture
def guarded(work: Path, tmp_path: Path) -> Workspace:
    """A repository in ``work`` with a nested one, a config file, a settings dir and a store."""
    for repo in (work, work / "vendor" / "lib"):
        (repo / ".git" / "hooks").mkdir(parents=True)
        (repo / ".git" / "config").write_text("[core]\n", encoding="utf-8")
    (work / "sub").mkdir()
    (work / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n", encoding="utf-8")
    (work / "agent.yaml").write_text("agents: []\n", encoding="utf-8")
    (work / "store").mkdir()
    (work / "store" / "s.jsonl").write_text("{}\n", encoding="utf-8")
    (work / "to_git").symlink_to(work / ".git", target_is_directory=True)
    (work / "to_config.yaml").symlink_to(work / "agent.yaml")
    alias = tmp_path / "alias"
    alias.symlink_to(work, target_is_directory=True)
    # protected paths as the runtime lists them, one of them reached through a symlink
    protected = (str(alias / "agent.yaml"), str(work / "store"), str(tmp_path / "settings"))
    return Workspace(protected=protected)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (symlinks not followed) and a file's content."""
    return {
        str(p): p.read_bytes() if p.is_file() and not p.is_symlink() else None
        for p in sorted(root.rglob("*"))
    }


PROTECTED = [
    ".git/config",
    ".git/hooks/pre-commit",
    "./.git/new/deep.txt",
    "vendor/lib/.git/config",
    "sub/.git",
    "new/.git/config",
    ".GIT/config",
    "to_git/hooks/post-checkout",
    "agent.yaml",
    "to_config.yaml",
    "src/../agent.yaml",
    "store/s.jsonl",
    "store/new.jsonl",
    "store",
]


@pytest.mark.parametrize("path", PROTECTED)
async def test_write_tools_refuse_protected_paths(
    work: Path, guarded: Workspace, path: str
) -> None:
    before = snapshot(work)
    wrote = await call("write_file", work, guarded, path=path, content="evil")
    message = assert_error(wrote, "PROTECTED_PATH")
    assert message == (
        f"Error: path {path!r} is protected: tools never write inside .git, nor the config "
        "file the runtime loaded, the CLI's settings directory or the store's files"
    )
    edited = await call("edit_file", work, guarded, path=path, old="[core]", new="evil")
    assert_error(edited, "PROTECTED_PATH")
    assert snapshot(work) == before


async def test_protection_is_exact(work: Path, guarded: Workspace) -> None:
    refused = await call("write_file", work, guarded, path="agent.yaml", content="x")
    assert_error(refused, "PROTECTED_PATH")
    assert_ok(await call("write_file", work, guarded, path="git/config", content="x"))
    assert_ok(await call("write_file", work, guarded, path=".gitignore", content="x"))
    assert_ok(await call("write_file", work, guarded, path="agent.yaml.bak", content="x"))
    assert_ok(await call("write_file", work, guarded, path="stored/x", content="x"))
    assert_ok(await call("edit_file", work, guarded, path="README.md", old="# Title", new="#"))


# --- run_command ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "workspace",
    [
        pytest.param(DEFAULT_WORKSPACE, marks=needs_bwrap, id="confined"),
        pytest.param(UNCONFINED, id="off"),
    ],
)
async def test_run_command(work: Path, workspace: Workspace) -> None:
    script = "pwd; echo out; echo err >&2; echo made > made.txt; exit 3"
    result = await call("run_command", work, workspace, command=script)
    text = assert_ok(result)
    assert text == f"{work}\nout\nerr\n[exit code: 3]"
    assert result.meta == {
        "exit_code": 3,
        "timed_out": False,
        "output_bytes": len(text) - 14,
        "sandbox": workspace.sandbox.mode,
        "timeout_s": builtin.DEFAULT_COMMAND_TIMEOUT_S,
    }
    assert (work / "made.txt").read_text(encoding="utf-8") == "made\n"
    quiet = assert_ok(await call("run_command", work, workspace, command="true"))
    assert quiet == "(no output)\n[exit code: 0]"


async def test_run_command_truncates_long_output(work: Path) -> None:
    result = await call("run_command", work, command="seq 1 20000")
    text = assert_ok(result)
    total = sum(len(f"{n}\n") for n in range(1, 20001))
    assert result.meta is not None
    assert result.meta["output_bytes"] == total
    dropped = total - builtin.COMMAND_OUTPUT_HEAD - builtin.COMMAND_OUTPUT_TAIL
    assert f"\n[... {dropped} bytes of output truncated ...]\n" in text
    assert text.startswith("1\n2\n3\n")
    assert text.endswith("19999\n20000\n[exit code: 0]")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_run_command_timeout_kills_the_process_group(work: Path) -> None:
    script = "sleep 30 & echo $! > bg.pid; echo started; sleep 30"
    start = trio.current_time()
    result = await call("run_command", work, UNCONFINED, command=script, timeout_s=0.5)
    assert trio.current_time() - start < 10
    assert result.error == "TIMEOUT"
    assert result.content == "started\n[timed out after 0.5s; the command was killed]"
    assert result.meta == {
        "exit_code": None,
        "timed_out": True,
        "output_bytes": 8,
        "sandbox": "off",
        "timeout_s": 0.5,
    }
    background = int((work / "bg.pid").read_text(encoding="utf-8"))
    with trio.move_on_after(5):
        while pid_alive(background):
            await trio.sleep(0.05)
    assert not pid_alive(background)


async def test_run_command_cancelled_from_outside(work: Path) -> None:
    with trio.move_on_after(0.5) as scope:
        await call("run_command", work, UNCONFINED, command="echo $$ > sh.pid; exec sleep 30")
    assert scope.cancelled_caught
    pid = int((work / "sh.pid").read_text(encoding="utf-8"))
    with trio.move_on_after(5):
        while pid_alive(pid):
            await trio.sleep(0.05)
    assert not pid_alive(pid)


async def test_run_command_in_a_missing_cwd(tmp_path: Path) -> None:
    result = await call("run_command", tmp_path / "gone", command="true")
    gone = str(tmp_path / "gone")
    assert assert_error(result, "NO_CWD") == f"Error: the agent's cwd {gone!r} is not a directory"


async def test_run_command_arguments(work: Path) -> None:
    assert_error(await call("run_command", work, command=""), "INVALID_ARGUMENTS")
    for bad in (0, -1, True, "10", float("inf"), float("-inf"), float("nan")):
        result = await call("run_command", work, UNCONFINED, command="touch ran", timeout_s=bad)
        message = assert_error(result, "INVALID_ARGUMENTS")
        assert message == "Error: timeout_s must be a positive, finite number"
    assert not (work / "ran").exists()


@pytest.mark.parametrize("huge", [1e308, 10**400, 601])
async def test_run_command_caps_timeout(work: Path, huge: float) -> None:
    result = await call("run_command", work, UNCONFINED, command="echo hi", timeout_s=huge)
    text = assert_ok(result)
    assert text == "hi\n[timeout_s was over the maximum: capped at 600s]\n[exit code: 0]"
    assert result.meta is not None
    assert result.meta["timeout_s"] == 600.0


async def test_run_command_cap_is_the_sandbox_maximum(work: Path) -> None:
    capped = Workspace(sandbox=Sandbox(mode="off", max_timeout_s=0.5))
    result = await call("run_command", work, capped, command="echo a; sleep 30", timeout_s=1e308)
    assert result.error == "TIMEOUT"
    assert result.content == (
        "a\n[timeout_s was over the maximum: capped at 0.5s]\n"
        "[timed out after 0.5s; the command was killed]"
    )
    low = Workspace(sandbox=Sandbox(mode="off", max_timeout_s=60))
    default = await call("run_command", work, low, command="true")
    assert assert_ok(default) == "(no output)\n[exit code: 0]"
    assert default.meta is not None
    assert default.meta["timeout_s"] == 60.0
    within = await call("run_command", work, low, command="true", timeout_s=59.5)
    assert within.meta is not None
    assert within.meta["timeout_s"] == 59.5


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "600"])
def test_sandbox_maximum_must_be_positive_and_finite(bad: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="max_timeout_s"):
        Sandbox(max_timeout_s=bad)


# --- confinement ------------------------------------------------------------------------------

ESCAPES = [
    "../outside/secret.txt",
    "src/../../outside/secret.txt",
    "/etc/passwd",
    "escape.txt",
    "escape_dir/secret.txt",
    "../nonexistent.txt",
]


def arguments_for(name: str, path: str) -> dict[str, Any]:
    extra: dict[str, dict[str, Any]] = {
        "read_file": {},
        "list_dir": {},
        "search_text": {"pattern": "secret"},
        "write_file": {"content": "pwned"},
        "edit_file": {"old": "top secret", "new": "pwned"},
    }
    return {"path": path, **extra[name]}


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize(
    "name", ["read_file", "list_dir", "search_text", "write_file", "edit_file"]
)
async def test_paths_outside_cwd_are_refused(
    work: Path, outside: Path, name: str, path: str
) -> None:
    result = await builtin_tool(name).handler(arguments_for(name, path), ctx(work))
    assert isinstance(result, ToolResult)
    message = assert_error(result, "PATH_OUTSIDE_CWD")
    assert message == f"Error: path {path!r} is outside the working directory"
    assert (outside / "secret.txt").read_text(encoding="utf-8") == "top secret\n"
    assert os.listdir(outside) == ["secret.txt"]
    assert not (work.parent / "nonexistent.txt").exists()


async def test_new_file_through_a_symlinked_directory_is_refused(work: Path, outside: Path) -> None:
    result = await call("write_file", work, path="escape_dir/new.txt", content="x")
    assert_error(result, "PATH_OUTSIDE_CWD")
    assert not (outside / "new.txt").exists()


async def test_cwd_itself_may_be_a_symlink(tmp_path: Path, work: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(work, target_is_directory=True)
    assert "line two" in assert_ok(await call("read_file", alias, path="README.md"))
    assert "line two" in assert_ok(await call("read_file", alias, path=str(work / "README.md")))
    assert_error(await call("read_file", alias, path="escape.txt"), "PATH_OUTSIDE_CWD")


async def test_relative_cwd_is_resolved(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(work.parent)
    assert assert_ok(await call("list_dir", Path("work"), path="src")) == "app.py"


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read_file", {"path": "a"}),
        ("list_dir", {}),
        ("search_text", {"pattern": "x"}),
        ("write_file", {"path": "a", "content": ""}),
        ("edit_file", {"path": "a", "old": "x", "new": "y"}),
        ("run_command", {"command": "true"}),
    ],
)
async def test_no_cwd_is_an_error_result(name: str, arguments: dict[str, Any]) -> None:
    result = await builtin_tool(name).handler(arguments, ctx(None))
    assert isinstance(result, ToolResult)
    assert assert_error(result, "NO_CWD") == (
        "Error: this tool works inside the agent's cwd, and the agent has none"
    )
