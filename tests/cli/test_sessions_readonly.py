"""``dsh-agent sessions ... --config``: only the config's store is read; nothing is imported,
started or read besides it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .helpers import QUICKSTART, cli

# Importing the tool module, starting the MCP server or reading the persona would each leave a
# trace: a marker file, a marker file, and a reader blocked forever on a FIFO with no writer.
MARKED = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      tools: ['marker_tools:TOOLS']
      agents:
        - {id: main, provider: demo, model: m, personaFile: persona.fifo}
store: sqlite:///kept.db
providers:
  demo: {kind: scripted, replies: [{text: hi}]}
mcpServers:
  marker:
    command: python3
    args: ['-c', 'open("mcp-started", "w").close()']
"""

MARKER_TOOLS = """\
from pathlib import Path

Path("tool-imported").write_text("imported")

from dsh_agent_loop import tool


@tool
async def noop() -> str:
    \"\"\"Nothing.\"\"\"
    return ""


TOOLS = [noop]
"""


@pytest.fixture
def workdir(tmp_path: Path) -> tuple[Path, str]:
    """A directory with one stored session in ``kept.db`` and the marking config."""
    done = cli(
        "run", str(QUICKSTART), "-q", "--prompt", "hi", "--store", "sqlite:///kept.db", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    listed = cli("sessions", "list", "--store", "sqlite:///kept.db", cwd=tmp_path)
    session_id = listed.stdout.split("\t")[0]
    (tmp_path / "marked.yaml").write_text(MARKED, encoding="utf-8")
    (tmp_path / "marker_tools.py").write_text(MARKER_TOOLS, encoding="utf-8")
    os.mkfifo(tmp_path / "persona.fifo")
    return tmp_path, session_id


def _traces(path: Path) -> list[str]:
    return [name for name in ("tool-imported", "mcp-started") if (path / name).exists()]


@pytest.mark.parametrize(
    "verb",
    [["list"], ["list", "--tree"], ["show", "ID"], ["check", "ID"], ["export", "ID"]],
    ids=lambda verb: " ".join(verb),
)
def test_sessions_verbs_read_only_the_store_of_the_config(
    workdir: tuple[Path, str], verb: list[str]
) -> None:
    path, session_id = workdir
    args = [session_id if word == "ID" else word for word in verb]
    done = cli("sessions", *args, "--config", "marked.yaml", cwd=path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert session_id in done.stdout  # the config's store was the one read
    assert _traces(path) == []
    assert not (path / "sessions.db").exists()


def test_export_to_a_file_reads_only_the_store(workdir: tuple[Path, str]) -> None:
    path, session_id = workdir
    done = cli(
        "sessions", "export", session_id, "-o", "out.jsonl", "--config", "marked.yaml", cwd=path
    )
    assert done.returncode == 0, done.stderr
    assert (path / "out.jsonl").read_text(encoding="utf-8").count("\n") > 5
    assert _traces(path) == []


def test_the_full_config_would_have_imported_the_tools(workdir: tuple[Path, str]) -> None:
    """The markers bite: ``run`` loads the whole config, which imports the tool module."""
    path, _ = workdir
    done = cli("run", "marked.yaml", "--prompt", "hi", cwd=path)
    assert done.returncode == 2  # the FIFO is no persona file
    assert "personaFile: file not found" in done.stderr
    assert _traces(path) == ["tool-imported"]


TOOLS_ONLY = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      tools: ['marker_tools:TOOLS']
"""


@pytest.mark.parametrize(
    ("store", "expected"),
    [
        ("mysql://db", "bad.yaml: store: unsupported store URL 'mysql://db'"),
        ("5", "bad.yaml: store: expected a store URL string"),
        (
            "sqlite:///x.db?bogus=1",
            "bad.yaml: store: bad store URL 'sqlite:///x.db?bogus=1': unknown option 'bogus'",
        ),
    ],
    ids=["scheme", "type", "option"],
)
def test_a_bad_store_exits_2_with_one_line_and_imports_nothing(
    tmp_path: Path, store: str, expected: str
) -> None:
    (tmp_path / "bad.yaml").write_text(f"{TOOLS_ONLY}store: {store}\n", encoding="utf-8")
    (tmp_path / "marker_tools.py").write_text(MARKER_TOOLS, encoding="utf-8")
    done = cli("sessions", "list", "--config", "bad.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(expected), done.stderr
    assert done.stderr.count("\n") == 1
    assert _traces(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "marker_tools.py"]


# The store-only reader keeps the bounds load_config keeps (these held before it too).
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("store: a\nstore: b\n", "bad.yaml: 2:1: invalid YAML: duplicate key 'store'"),
        ("- a list\n", "bad.yaml: expected a mapping (plugins, store, providers, mcpServers)"),
        ("store: [\n", "bad.yaml: 2:1: invalid YAML: "),
        (f"store: {'[' * 10_000}{']' * 10_000}\n", "bad.yaml: invalid YAML: nested too deeply"),
        ("store: x\n#" + "x" * 1024 * 1024, "bad.yaml: file is larger than 1048576 bytes"),
    ],
    ids=["duplicate", "list", "syntax", "deep", "large"],
)
def test_a_malformed_config_exits_2_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "bad.yaml").write_text(text, encoding="utf-8")
    done = cli("sessions", "list", "--config", "bad.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(expected), done.stderr
    assert done.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_config_without_a_store_uses_the_default(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text(TOOLS_ONLY, encoding="utf-8")
    (tmp_path / "marker_tools.py").write_text(MARKER_TOOLS, encoding="utf-8")
    done = cli("sessions", "list", "--config", "empty.yaml", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    missing = cli("sessions", "show", "nope", "--config", "empty.yaml", cwd=tmp_path)
    assert missing.stderr == "session 'nope' not found in sqlite:///sessions.db\n"
    assert _traces(tmp_path) == []


def test_aliases_elsewhere_in_the_file_are_never_expanded(tmp_path: Path) -> None:
    """Nine levels of nine aliases (a "billion laughs") stay shared references: only the
    store is looked at, so the file is read, not refused."""
    lines = ['lol1: &lol1 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(2, 10):
        lines.append(f"lol{level}: &lol{level} [" + ",".join([f"*lol{level - 1}"] * 9) + "]")
    text = "\n".join(lines) + "\nstore: 'sqlite:///laughs.db'\n"
    (tmp_path / "laughs.yaml").write_text(text, encoding="utf-8")
    done = cli("sessions", "show", "nope", "--config", "laughs.yaml", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        2,
        "session 'nope' not found in sqlite:///laughs.db\n",
    )
