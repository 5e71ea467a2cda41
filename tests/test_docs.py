"""The documentation runs: every ```python block of docs/*.md (and README.md), and every example.

Each Markdown ```python block is a self-contained program. It is written to a fresh temporary
directory and run there with this interpreter in a subprocess, so blocks cannot lean on each
other, on the repository's working directory, or on state left by another test. A block fails
the test when it exits non-zero (an ``assert`` inside it, an exception, a timeout).

Markers, an HTML comment on the line just before the opening fence, change that:

- ``<!-- pytest -->``: the block is a pytest test module; it runs with ``pytest`` (pytest-trio,
  ``trio_mode = true``) in the temporary directory, and every test in it must pass.
- ``<!-- skip-test -->``: the block is shown but not run. Only for what genuinely cannot run
  offline (a real provider's API key, a database server); kept rare by
  ``test_skipped_blocks_are_rare``.
- ``<!-- console-test -->`` on a ``console`` block: its ``$ `` lines run, in order, in one bash
  script, in a temporary directory holding a copy of ``examples/`` (with this interpreter's
  ``dsh-agent`` first on ``PATH`` and an empty ``XDG_CONFIG_HOME``). Each command must exit 0,
  or the code its trailing ``# exit N`` comment names. Output lines are not compared (they
  hold session ids and timings).

Other ``console``, ``yaml``, ``text`` blocks are not executed. Every ``examples/*.py`` runs the
same way as a block (fresh directory, subprocess) and must exit 0 well within its time budget.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = sorted((ROOT / "docs").glob("*.md")) + [p for p in (ROOT / "README.md",) if p.exists()]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: The pages this suite promises; each must exist and hold at least one checked block.
REQUIRED_PAGES = (
    "quickstart.md",
    "concepts.md",
    "events.md",
    "configuration.md",
    "embedding.md",
    "testing.md",
    "stores.md",
)
#: Seconds one block or example may run before it counts as hung.
TIMEOUT = 120
#: Examples promise to finish in under 10 s; this is that promise with slack for a busy machine.
EXAMPLE_BUDGET = 30.0
MAX_SKIPPED = 3

_FENCE_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^`]*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<name>[\w-]+)\s*-->\s*$")
_MARKERS = frozenset({"pytest", "skip-test", "console-test"})
_EXPECTED_EXIT = re.compile(r"\s+#\s*exit\s+(?P<code>\d+)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    marker: str | None
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the marker comment just above it, if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if opened is None:
            i += 1
            continue
        fence = opened["fence"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{path.name}:{start + 1}: code fence is never closed")
        marker = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and (found := _MARKER.match(lines[j])) and found["name"] in _MARKERS:
            marker = found["name"]
        blocks.append(Block(path, start + 1, opened["lang"].lower(), marker, "\n".join(body)))
        i += 1
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in parse_blocks(path)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang in ("python", "py")]
CONSOLE_TESTS = [b for b in ALL_BLOCKS if b.lang == "console" and b.marker == "console-test"]


def console_script(code: str) -> str:
    """A bash script running each ``$ `` line of a console block, checking its exit code."""
    out = ["set -u"]
    for line in code.splitlines():
        if not line.startswith("$ "):
            continue  # output shown in the docs
        command = line[2:]
        expected = 0
        if found := _EXPECTED_EXIT.search(command):
            expected = int(found["code"])
            command = command[: found.start()]
        out += [
            command,
            "rc=$?",
            f'if [ "$rc" -ne {expected} ]; then',
            f'  echo "exit $rc (expected {expected}): "{shlex.quote(command)} >&2',
            "  exit 1",
            "fi",
        ]
    return "\n".join(out) + "\n"


def _run(
    args: list[str], cwd: Path, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", **(env_extra or {}))
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("DSH_AGENT_STORE", None)  # the CLI's default store: the blocks say where they store
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def _report(what: str, result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{what} exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
    )


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            b,
            id=b.id,
            marks=[pytest.mark.skip(reason="marked <!-- skip-test -->")]
            if b.marker == "skip-test"
            else [],
        )
        for b in PYTHON_BLOCKS
    ],
)
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    if block.marker == "pytest":
        (tmp_path / "pytest.ini").write_text(
            "[pytest]\ntrio_mode = true\nfilterwarnings = error\n", encoding="utf-8"
        )
        (tmp_path / "test_doc_block.py").write_text(block.code + "\n", encoding="utf-8")
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_doc_block.py"]
        result = _run(args, tmp_path)
        assert result.returncode == 0, _report(f"pytest on the block at {block.id}", result)
        assert " passed" in result.stdout, _report(f"the block at {block.id} ran no test", result)
        return
    script = tmp_path / "doc_block.py"
    script.write_text(block.code + "\n", encoding="utf-8")
    result = _run([sys.executable, str(script)], tmp_path)
    assert result.returncode == 0, _report(f"the block at {block.id}", result)


@pytest.mark.parametrize("block", CONSOLE_TESTS, ids=[b.id for b in CONSOLE_TESTS])
def test_console_block_runs(block: Block, tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("console blocks need bash")
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    (tmp_path / "xdg").mkdir()
    script = tmp_path / "console.sh"
    script.write_text(console_script(block.code), encoding="utf-8")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
    }
    result = _run(["bash", str(script)], work, env)
    assert result.returncode == 0, _report(f"the console block at {block.id}", result)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(example: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    result = _run([sys.executable, str(example)], tmp_path)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, _report(f"examples/{example.name}", result)
    assert elapsed < EXAMPLE_BUDGET, f"examples/{example.name} took {elapsed:.1f}s"


def test_required_pages_exist_and_hold_checked_blocks() -> None:
    names = {p.name for p in DOC_FILES}
    missing = [page for page in REQUIRED_PAGES if page not in names]
    assert not missing, f"missing docs pages: {missing}"
    for page in REQUIRED_PAGES:
        checked = [b for b in PYTHON_BLOCKS if b.path.name == page and b.marker != "skip-test"]
        assert checked, f"docs/{page} has no checked python block"


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"embed_minimal.py", "exclusive_tool.py", "many_agents.py"} <= names


def test_skipped_blocks_are_rare() -> None:
    skipped = [b.id for b in PYTHON_BLOCKS if b.marker == "skip-test"]
    assert len(skipped) <= MAX_SKIPPED, f"too many skipped blocks: {skipped}"


def test_markers_sit_on_the_right_blocks() -> None:
    misplaced = [
        b.id
        for b in ALL_BLOCKS
        if b.marker is not None and (b.lang == "console") != (b.marker == "console-test")
    ]
    assert not misplaced, f"console-test marks console blocks, the others python ones: {misplaced}"
    assert all(b.lang in ("python", "py", "console") for b in ALL_BLOCKS if b.marker is not None)


def test_console_script_checks_exit_codes(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    good = console_script("$ true\noutput line, not run\n$ false   # exit 1\n")
    assert "output line" not in good
    bad = console_script("$ true\n$ (exit 3)\n$ true\n")
    for script, expected in ((good, 0), (bad, 1)):
        path = tmp_path / "script.sh"
        path.write_text(script, encoding="utf-8")
        result = _run(["bash", str(path)], tmp_path)
        assert result.returncode == expected, result.stderr


def test_fence_parser_reads_markers_and_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Intro\n\n```console\n$ dsh-agent run x.yaml\n```\n\n<!-- pytest -->\n"
        "```python\nasync def test_x():\n    assert True\n```\n\n<!-- skip-test -->\n\n"
        "```python\nraise SystemExit(1)\n```\n\n```python\nprint('hi')\n```\n",
        encoding="utf-8",
    )
    blocks = parse_blocks(page)
    assert [(b.lang, b.marker, b.line) for b in blocks] == [
        ("console", None, 3),
        ("python", "pytest", 8),
        ("python", "skip-test", 15),
        ("python", None, 19),
    ]
    assert blocks[3].code == "print('hi')"


#: What the docs may import: the pinned public namespaces (tests/test_public_surface.py).
PINNED_NAMESPACES = frozenset(
    {
        "dsh_agent_loop",
        "dsh_agent_loop.testing",
        "dsh_agent_loop.stores",
        "dsh_agent_loop.stores.postgres",
        "dsh_agent_loop.stores.sqlite",
        "dsh_agent_loop.llm",
        "dsh_agent_loop.events",
        "dsh_agent_loop.mcp",
        "dsh_agent_loop.otel",
        "dsh_agent_loop.serve",
        "dsh_agent_loop.config",
        "dsh_agent_loop.invariants",
    }
)


def unpinned_imports(code: str) -> list[str]:
    """Modules of the package that ``code`` imports and that no pinned namespace is."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = None
    names: list[str] = []
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
                if node.module == "dsh_agent_loop":  # ``from dsh_agent_loop import _runtime``
                    names += [f"dsh_agent_loop.{a.name}" for a in node.names if a.name[0] == "_"]
            elif isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
    else:  # not Python (a console or a partial snippet): read the import lines
        names = re.findall(r"(?:from|import)\s+(dsh_agent_loop[\w.]*)", code)
    package_modules = [n for n in names if n == "dsh_agent_loop" or n.startswith("dsh_agent_loop.")]
    root_attrs = {"Agent", "invariants"}
    return [
        n
        for n in package_modules
        if n not in PINNED_NAMESPACES and n.rpartition(".")[2] not in root_attrs
    ]


def test_docs_import_only_pinned_namespaces() -> None:
    bad = [
        f"{b.id}: {name}"
        for b in ALL_BLOCKS
        if b.lang in ("python", "py", "pycon", "")
        for name in unpinned_imports(b.code)
    ]
    for example in EXAMPLES:
        bad += [f"{example.name}: {n}" for n in unpinned_imports(example.read_text("utf-8"))]
    assert bad == []
    assert sum(1 for b in PYTHON_BLOCKS if "dsh_agent_loop" in b.code) > 20  # the test sees them


def test_the_import_check_catches_an_internal_module() -> None:
    code = (
        "from dsh_agent_loop import open_runtime\n"
        "from dsh_agent_loop.llm import Usage\n"
        "from dsh_agent_loop.llm._base import Usage\n"
        "import dsh_agent_loop._agent.turn\n"
        "from dsh_agent_loop import _runtime\n"
    )
    assert unpinned_imports(code) == [
        "dsh_agent_loop.llm._base",
        "dsh_agent_loop._agent.turn",
        "dsh_agent_loop._runtime",
    ]
