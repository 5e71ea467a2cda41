"""The package's shape, read from the source with ``ast`` (docs/design.md#code-shape).

1. No import cycle among the modules of ``dsh_agent_loop``. Every import statement counts,
   those inside functions too (a deferred import is still a dependency, only hidden) and those
   under ``if TYPE_CHECKING:`` (a type is a dependency too: a circle of types is a circle of
   modules that cannot be understood one at a time). An edge goes to the module an import
   names: ``from .a import b`` is an edge to ``a.b`` when that is a module, else to ``a``;
   importing a submodule does not count as importing its parent packages' ``__init__``.
2. No module imports a private module (a dotted-path component starting with ``_``, dunders
   aside) of another package: the package that holds the private part must be the importer's
   own package or one of its ancestors. The benchmarks use the package as an application would:
   ``dsh_agent_loop.bench`` imports no private module outside itself (an ancestor's neither),
   and ``scripts/bench`` (thin wrappers around it) none at all. Nothing outside
   ``dsh_agent_loop.bench`` imports it (``dsh-agent bench`` loads it by name, when it runs).
3. No module over 600 lines, no function (or method) over 80 lines in ``src``.
4. No module uses another module's private names (``_x``, dunders aside) on objects of a class
   it does not define: ``obj._x`` (``obj`` not ``self``/``cls``) is allowed only when a class
   of the same module defines ``_x`` (a method, a class attribute, a ``__slots__`` entry or a
   ``self._x`` assignment). Friends that must share privates live in one module
   (``docs/architecture.md``); one reasoned exception is listed (``PRIVATE_READS_ALLOWED``).
5. The turn machine never imports the module that defines the public ``Agent``
   (``_agent/agent.py``) nor its actor's (``_agent/_actor.py``), not even for types: it receives
   the actor as a ``TurnContext`` (``_agent/_turn_context.py``).

The checkers are plain functions, tested first on a small fake tree so that each bar is seen
to fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = "dsh_agent_loop"
BENCH = ROOT / "scripts" / "bench"
BENCH_PACKAGE = f"{PACKAGE}.bench"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


# --- the checker ----------------------------------------------------------------------------------


@attrs.frozen
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package a relative import starts from (the module's own for ``__init__``)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def discover(src: Path, package: str) -> dict[str, Module]:
    """Every module of ``package`` under the source root ``src``, by dotted name."""
    modules: dict[str, Module] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements anywhere in ``node``, ``if TYPE_CHECKING:`` bodies included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        else:
            yield from _import_nodes(child)


def imported_names(tree: ast.AST, module: Module | None) -> Iterator[tuple[str, int]]:
    """``(dotted name, line)`` of everything imported: modules and ``module.attribute``s.

    Relative imports are resolved against ``module`` (None: only absolute imports count).
    """
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
            continue
        if node.level:
            if module is None:
                continue
            base = module.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        for alias in node.names:
            yield (target if alias.name == "*" else f"{target}.{alias.name}"), node.lineno


def resolve(name: str, modules: Iterable[str]) -> str | None:
    """The module ``name`` is, or holds (``pkg.mod.attr`` → ``pkg.mod``); None if external."""
    known = set(modules)
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """Per module, the internal modules it imports (with the line of the first import)."""
    graph: dict[str, dict[str, int]] = {}
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        edges: dict[str, int] = {}
        for name, line in imported_names(tree, module):
            target = resolve(name, modules)
            if target is not None and target != module.name:
                edges.setdefault(target, line)
        graph[module.name] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # the package is small: recursion depth is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe_cycle(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    edges = [
        f"{source} -> {target} (line {line})"
        for source in component
        for target, line in sorted(graph[source].items())
        if target in members
    ]
    return f"cycle among {', '.join(component)}: " + "; ".join(edges)


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_owner(name: str) -> str | None:
    """The package holding the first private part of ``name``; None if nothing is private."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if _is_private(part):
            return ".".join(parts[:i])
    return None


def private_import_violations(
    modules: dict[str, Module], graph: dict[str, dict[str, int]]
) -> list[str]:
    """Imports of another package's private module: ``importer:line imports target``."""
    out = []
    for name, edges in sorted(graph.items()):
        package = modules[name].package
        for target, line in sorted(edges.items()):
            owner = private_owner(target)
            if owner is None:
                continue
            if package == owner or package.startswith(owner + "."):
                continue  # its own package's, or an ancestor's
            out.append(f"{name}:{line} imports {target} (private to {owner})")
    return out


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def private_imports_from(graph: dict[str, dict[str, int]], package: str) -> list[str]:
    """Private modules outside ``package`` that the modules of ``package`` import."""
    return [
        f"{name}:{line} imports {target}"
        for name, edges in sorted(graph.items())
        if _within(name, package)
        for target, line in sorted(edges.items())
        if private_owner(target) is not None and not _within(target, package)
    ]


def imports_into(graph: dict[str, dict[str, int]], package: str) -> list[str]:
    """Imports of the modules of ``package`` by modules outside it."""
    return [
        f"{name}:{line} imports {target}"
        for name, edges in sorted(graph.items())
        if not _within(name, package)
        for target, line in sorted(edges.items())
        if _within(target, package)
    ]


def script_private_imports(paths: Iterable[Path], package: str, src: Path) -> list[str]:
    """Private modules of ``package`` imported by the scripts at ``paths``."""
    modules = discover(src, package)
    out = []
    for path in sorted(paths):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line in imported_names(tree, None):
            if name != package and not name.startswith(package + "."):
                continue
            target = resolve(name, modules) or name
            if private_owner(target) is not None:
                out.append(f"{path.relative_to(path.parents[1])}:{line} imports {target}")
    return out


def _class_names(tree: ast.AST) -> set[str]:
    """Every name a class of ``tree`` defines: methods, class attributes, slots, ``self.x = ``."""
    names: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    names.add(target.id)
                    if target.id == "__slots__" and node.value is not None:
                        names.update(
                            c.value
                            for c in ast.walk(node.value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        )
    return names


def private_access_violations(
    modules: dict[str, Module], allowed: Iterable[tuple[str, str]] = ()
) -> list[str]:
    """``module:line expr``: a private name used on an object of a class the module lacks.

    ``allowed`` lists ``(module, name)`` pairs exempted (with a reason, where they are listed).
    """
    exempt = set(allowed)
    out = []
    for name, module in sorted(modules.items()):
        tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        own = _class_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
                continue
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if node.attr in own or (name, node.attr) in exempt:
                continue
            out.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    return out


def size_violations(modules: dict[str, Module], max_module: int, max_function: int) -> list[str]:
    """Modules over ``max_module`` lines; functions (methods, nested ones) over ``max_function``."""
    out = []
    for name, module in sorted(modules.items()):
        text = module.path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > max_module:
            out.append(f"module {name}: {lines} lines (max {max_module})")
        for node in ast.walk(ast.parse(text, str(module.path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > max_function:
                    out.append(
                        f"function {name}.{node.name} (line {node.lineno}): {length} lines "
                        f"(max {max_function})"
                    )
    return out


# --- the checker on a fake tree ------------------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


FAKE = {
    "pkg/__init__.py": "from .a import A\n",
    "pkg/_util.py": "X = 1\n",
    "pkg/a.py": "from .sub import b\nA = 1\n",
    "pkg/sub/__init__.py": "",
    # a deferred import is still a dependency
    "pkg/sub/b.py": "def f():\n    from ..a import A\n    return A\n",
    "pkg/sub/_priv.py": "from .._util import X\n",  # an ancestor's private module: fine
    "pkg/sub/c.py": (
        "from typing import TYPE_CHECKING\n"
        "from . import _priv\n"  # its own package's: fine
        "if TYPE_CHECKING:\n"
        "    from ..other import d  # closes a cycle: a type is a dependency too\n"
        "else:\n"
        "    import json\n"
    ),
    "pkg/other/__init__.py": "",
    "pkg/other/d.py": "from ..sub import c\nfrom ..sub._priv import X\nimport pkg.sub._priv as p\n",
    "pkg/other/_e.py": "from pkg.other import d\n",
}


def test_the_checker_finds_cycles_through_deferred_imports_only(tmp_path: Path) -> None:
    write(tmp_path, FAKE)
    modules = discover(tmp_path, "pkg")
    assert set(modules) == {
        "pkg",
        "pkg._util",
        "pkg.a",
        "pkg.sub",
        "pkg.sub.b",
        "pkg.sub._priv",
        "pkg.sub.c",
        "pkg.other",
        "pkg.other.d",
        "pkg.other._e",
    }
    graph = import_graph(modules)
    assert graph["pkg"] == {"pkg.a": 1}
    # TYPE_CHECKING imports count (and their else branch)
    assert graph["pkg.sub.c"] == {"pkg.sub._priv": 2, "pkg.other.d": 4}
    assert graph["pkg.other.d"] == {"pkg.sub.c": 1, "pkg.sub._priv": 2}
    cycles = import_cycles(graph)
    assert cycles == [["pkg.a", "pkg.sub.b"], ["pkg.other.d", "pkg.sub.c"]]
    text = describe_cycle(cycles[0], graph)
    assert "pkg.a -> pkg.sub.b (line 1)" in text
    assert "pkg.sub.b -> pkg.a (line 2)" in text


def test_the_checker_finds_private_imports_of_other_packages(tmp_path: Path) -> None:
    write(tmp_path, FAKE)
    modules = discover(tmp_path, "pkg")
    graph = import_graph(modules)
    assert private_import_violations(modules, graph) == [
        "pkg.other.d:2 imports pkg.sub._priv (private to pkg.sub)"
    ]
    assert private_owner("pkg.sub._priv") == "pkg.sub"
    assert private_owner("pkg._x.y") == "pkg"
    assert private_owner("pkg.__init__") is None
    scripts = tmp_path / "scripts" / "bench"
    write(
        scripts,
        {
            "ok.py": "import pkg.a\nfrom pkg.sub import c\n",
            "bad.py": "from pkg.sub._priv import X\ndef f():\n    from pkg import _util\n",
        },
    )
    assert script_private_imports(scripts.glob("*.py"), "pkg", tmp_path) == [
        "bench/bad.py:1 imports pkg.sub._priv",
        "bench/bad.py:3 imports pkg._util",
    ]


def test_the_checker_keeps_a_package_to_the_public_modules_and_unimported(tmp_path: Path) -> None:
    write(tmp_path, FAKE)
    graph = import_graph(discover(tmp_path, "pkg"))
    # pkg.sub._priv imports an ancestor's private module: allowed by rule 2, not here.
    assert private_imports_from(graph, "pkg.sub") == ["pkg.sub._priv:1 imports pkg._util"]
    assert private_imports_from(graph, "pkg.other") == ["pkg.other.d:2 imports pkg.sub._priv"]
    assert imports_into(graph, "pkg.other") == ["pkg.sub.c:4 imports pkg.other.d"]  # a type
    assert imports_into(graph, "pkg.sub") == [
        "pkg.a:1 imports pkg.sub.b",
        "pkg.other.d:2 imports pkg.sub._priv",
        "pkg.other.d:1 imports pkg.sub.c",
    ]


def test_the_checker_finds_long_modules_and_functions(tmp_path: Path) -> None:
    def lines(indent: str, count: int) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(count))

    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/long.py": "\n" * 9,  # one line over
            "pkg/full.py": "\n" * 8,  # at the limit
            "pkg/f.py": "class C:\n    async def m(self):\n" + lines(" " * 8, 5),  # 6 lines
            "pkg/g.py": "def at_the_limit():\n" + lines("    ", 4),  # 5 lines
        },
    )
    found = size_violations(discover(tmp_path, "pkg"), max_module=8, max_function=5)
    assert found == [
        "function pkg.f.m (line 2): 6 lines (max 5)",
        "module pkg.long: 9 lines (max 8)",
    ]


PRIVATE_FAKE = {
    "pkg/__init__.py": "",
    "pkg/owner.py": (
        "class Owner:\n"
        "    __slots__ = ('_slot', '_made')\n"
        "    _flag = 1\n"
        "    def __init__(self):\n"
        "        self._slot = 0\n"
        "    def _helper(self):\n"
        "        return self._slot\n"
        "class Friend:\n"  # friends in one module share privates
        "    def poke(self, o):\n"
        "        return o._slot + o._flag + o._made + o._helper() + len(o.__slots__)\n"
    ),
    "pkg/user.py": (
        "from .owner import Owner\n"
        "def use(o: Owner):\n"
        "    o._helper()\n"  # another module's private method
        "    return o.public\n"
        "class Mine:\n"
        "    def m(self, o):\n"
        "        self._own = o.x._slot\n"  # another module's private slot, on any receiver
        "        return self._own + o.__class__.__name__\n"
    ),
}


def test_the_checker_finds_private_names_used_on_other_modules_objects(tmp_path: Path) -> None:
    write(tmp_path, PRIVATE_FAKE)
    modules = discover(tmp_path, "pkg")
    assert private_access_violations(modules) == ["pkg.user:3 o._helper", "pkg.user:7 o.x._slot"]
    assert private_access_violations(modules, [("pkg.user", "_slot")]) == ["pkg.user:3 o._helper"]


# --- the package ------------------------------------------------------------------------------

#: The one exception to rule 4: ``FrozenDict``'s shape and values (``_frozen.py``) are read in
#: place where every event is folded or encoded — a function call there is measurable — and
#: ``__getattr__`` reads a mapping's keys, so they cannot have public attribute names.
PRIVATE_READS_ALLOWED = [
    (f"{PACKAGE}.{module}", name)
    for module in ("_session.history", "_session.projections", "_session.records", "stores._rows")
    for name in ("_k", "_v")
]

#: The turn machine: handed the agent's actor as a ``TurnContext``, never the ``Agent``.
TURN_MACHINE = [
    f"{PACKAGE}._agent.{name}"
    for name in (
        "_judge", "_permissions", "_tokens", "_tool_invoke", "_turn_context", "approvals",
        "attempt", "calls", "compaction", "context", "delegate", "inbox", "options", "output",
        "prompt", "request", "results", "series", "services", "statistics", "step_inputs",
        "subagents", "subscription", "tool_calls", "turn",
    )
]  # fmt: skip


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    found = discover(SRC, PACKAGE)
    assert len(found) > 50, f"too few modules under {SRC / PACKAGE}"
    return found


@pytest.fixture(scope="module")
def graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    return import_graph(modules)


def test_no_import_cycle(graph: dict[str, dict[str, int]]) -> None:
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe_cycle(c, graph) for c in cycles)


def test_the_graph_sees_the_package_imports(graph: dict[str, dict[str, int]]) -> None:
    """A sanity check of the reader: known imports are edges."""
    assert "dsh_agent_loop.stores.sqlite._sync" in graph["dsh_agent_loop.stores.sqlite._commit"]
    assert "dsh_agent_loop.stores._rows" in graph["dsh_agent_loop.stores.sqlite._commit"]
    assert "dsh_agent_loop.llm._http" in graph["dsh_agent_loop.llm._openai"]
    # an import under TYPE_CHECKING (turn.py's) is an edge too
    assert "dsh_agent_loop._agent._turn_context" in graph["dsh_agent_loop._agent.turn"]


def test_no_private_module_of_another_package_is_imported(
    modules: dict[str, Module], graph: dict[str, dict[str, int]]
) -> None:
    found = private_import_violations(modules, graph)
    assert not found, "private modules imported from another package:\n" + "\n".join(found)


def test_the_bench_package_imports_no_private_module(graph: dict[str, dict[str, int]]) -> None:
    assert any(_within(name, BENCH_PACKAGE) for name in graph), f"no {BENCH_PACKAGE} modules"
    found = private_imports_from(graph, BENCH_PACKAGE)
    assert not found, f"{BENCH_PACKAGE} imports private modules:\n" + "\n".join(found)


def test_nothing_outside_the_bench_package_imports_it(graph: dict[str, dict[str, int]]) -> None:
    found = imports_into(graph, BENCH_PACKAGE)
    assert not found, f"{BENCH_PACKAGE} imported from outside:\n" + "\n".join(found)


def test_the_bench_scripts_import_no_private_module() -> None:
    scripts = sorted(BENCH.glob("*.py"))
    assert scripts, f"no scripts under {BENCH}"
    found = script_private_imports(scripts, PACKAGE, SRC)
    assert not found, "scripts/bench imports private modules:\n" + "\n".join(found)


def test_no_module_or_function_is_too_long(modules: dict[str, Module]) -> None:
    found = size_violations(modules, MAX_MODULE_LINES, MAX_FUNCTION_LINES)
    assert not found, "too long:\n" + "\n".join(found)


def test_no_private_name_of_another_module_is_used(modules: dict[str, Module]) -> None:
    found = private_access_violations(modules, PRIVATE_READS_ALLOWED)
    assert not found, "private names used on another module's objects:\n" + "\n".join(found)


def test_the_turn_machine_never_imports_the_agent_or_its_actor(
    graph: dict[str, dict[str, int]],
) -> None:
    facade = {f"{PACKAGE}._agent.agent", f"{PACKAGE}._agent._actor"}
    missing = [name for name in TURN_MACHINE if name not in graph]
    assert not missing, f"no such modules: {missing}"
    found = [
        f"{name}:{line} imports {target}"
        for name in TURN_MACHINE
        for target, line in sorted(graph[name].items())
        if target in facade
    ]
    assert not found, "the turn machine imports the Agent or its actor:\n" + "\n".join(found)
