"""The agent modules import each other without a cycle (imports under TYPE_CHECKING included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dsh_agent_loop

PACKAGE = Path(dsh_agent_loop.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Package modules ``path`` imports (module level, inside functions, for types)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:  # ``from . import x`` may name a submodule
                found.add(f"{target}.{alias.name}")
            found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _graph(root: Path) -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in root.rglob("*.py")}
    return {name: _imports(path) & modules.keys() - {name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)) is not None:
            return found
    return None


def test_the_agent_modules_have_no_import_cycle() -> None:
    graph = _graph(PACKAGE / "_agent")
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    # the turn machine depends downward only: actor -> turn -> attempt -> series
    assert "dsh_agent_loop._agent._actor" not in graph["dsh_agent_loop._agent.turn"]
    assert "dsh_agent_loop._agent.agent" not in graph["dsh_agent_loop._agent.turn"]
    assert "dsh_agent_loop._agent.turn" not in graph["dsh_agent_loop._agent.attempt"]


def test_the_cycle_finder_bites() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


AGENT_MODULES = sorted(_module_name(p) for p in (PACKAGE / "_agent").glob("*.py"))

_IMPORT_EACH = """
import importlib, sys
for module in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.startswith("dsh_agent_loop")]:
        del sys.modules[loaded]
    importlib.import_module(module)  # first, with nothing of the package loaded
"""


def test_each_agent_module_imports_first() -> None:
    # One fresh interpreter; the package is unloaded before each module is imported.
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, *AGENT_MODULES],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "dsh_agent_loop._agent.turn" in AGENT_MODULES
