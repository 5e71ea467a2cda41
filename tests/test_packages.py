"""The direction between the packages, as one table: each group may import only what it lists.

A group is a subpackage (``_agent``, ``config``, ...), a root module of its own (``otel``,
``invariants``), the root ``__init__`` (``root``: the public face), or one of two sets of root
modules: ``base`` (the plain records and small helpers everything may use; they import only each
other) and ``runtime`` (``_runtime.py`` and the modules that compose it from a config). Every
import counts: those inside functions (a deferred import is still a dependency) and those under
``if TYPE_CHECKING:`` (a type is a dependency too). An edge inside one group is not checked here
(``tests/test_layering.py`` checks that no import cycle remains anywhere).

Two edges are allowed only as deferred imports, inside a function: ``runtime`` imports ``otel``
(which imports opentelemetry, an optional extra) only when tracing is asked for.

``docs/architecture.md`` shows the same table: ``test_the_docs_show_the_table`` renders it and
looks for it there, so the page and the rule cannot drift apart.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = "dsh_agent_loop"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: Root modules of the bottom layer: records and helpers every package may import.
BASE = (
    "_errors",
    "events",
    "_hooks",
    "_limits",
    "_permissions",
    "_sandbox",
    "_frozen",
    "_gc",
    "_mcp_names",
    "_permission_rules",
    "_slots",
    "_store_url",
    "_wakeup",
)
#: Root modules that build a runtime: ``open_runtime`` and the composition from a config.
COMPOSITION = ("_runtime", "_compose", "_providers")

#: Group → the groups it may import, top to bottom (the order of the table).
ALLOWED: Mapping[str, tuple[str, ...]] = {
    "cli": (
        "root", "runtime", "_serve", "fleet", "_agent", "invariants", "stores", "mcp", "config",
        "llm", "_tools", "_session", "base",
    ),
    "bench": ("root", "stores", "llm", "base"),
    "testing": ("runtime", "_agent", "invariants", "stores", "llm", "_tools", "_session", "base"),
    "root": (
        "runtime", "fleet", "_agent", "invariants", "stores", "config", "llm", "_tools",
        "_session", "base",
    ),
    "runtime": (
        "otel", "fleet", "_fleet", "_agent", "stores", "mcp", "config", "llm", "_tools",
        "_session", "base",
    ),
    "serve": ("_serve",),
    "_serve": ("fleet", "_fleet", "_agent", "_session", "base"),
    "fleet": ("_fleet",),
    "_fleet": ("_agent", "stores", "_session", "base"),
    "otel": ("_agent", "_session", "base"),
    "_agent": ("llm", "_tools", "_session", "base"),
    "invariants": ("_session", "base"),
    "stores": ("_session", "base"),
    "mcp": ("_tools", "base"),
    "config": ("base",),
    "llm": ("base",),
    "_tools": ("base",),
    "_session": ("base",),
    "base": (),
}  # fmt: skip
#: Allowed edges that must be deferred (no import of the target while the importer loads).
DEFERRED_ONLY = frozenset({("runtime", "otel")})

#: How the table names each group.
LABELS: Mapping[str, str] = {
    "root": "`root` (`__init__.py`)",
    "runtime": "`runtime` (" + ", ".join(f"`{name}.py`" for name in COMPOSITION) + ")",
    "base": "`base` (" + ", ".join(f"`{name}.py`" for name in BASE) + ")",
}


# --- the checker ----------------------------------------------------------------------------------


@attrs.frozen
class Edge:
    """One import of a module of the package by another: where, and whether it runs at load."""

    source: str
    target: str
    line: int
    eager: bool
    """At module level outside ``if TYPE_CHECKING:``: the target is imported with the source."""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, eager: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``node``, and whether it runs when the module loads."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, eager
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for part in child.body:
                yield from _imports_of(part, eager=False)
            for part in child.orelse:
                yield from _imports_of(part, eager)
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _imports(child, eager=False)
        else:
            yield from _imports(child, eager)


def _imports_of(node: ast.stmt, eager: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, eager
    else:
        yield from _imports(node, eager)


def discover(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``src``: dotted name → path (a package is its init)."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(node: ast.Import | ast.ImportFrom, alias: ast.alias, package: str) -> str:
    if isinstance(node, ast.Import):
        return alias.name
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        module = ".".join([*base, node.module] if node.module else base)
    else:
        module = node.module or ""
    return module if alias.name == "*" else f"{module}.{alias.name}"


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def edges(src: Path, package: str) -> list[Edge]:
    """Every import of one module of ``package`` by another, in file order."""
    modules = discover(src, package)
    found: dict[tuple[str, str, int], Edge] = {}
    for name, path in modules.items():
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, eager in _imports(tree, eager=True):
            for alias in node.names:
                target = _resolve(_target(node, alias, own), modules)
                if target is not None and target != name:
                    found.setdefault(
                        (name, target, node.lineno), Edge(name, target, node.lineno, eager)
                    )
    return list(found.values())


def group_of(module: str, package: str) -> str:
    """The group of the table ``module`` belongs to (its top-level name below ``package``)."""
    if module == package:
        return "root"
    top = module.split(".")[1]
    if top in BASE:
        return "base"
    if top in COMPOSITION:
        return "runtime"
    return top


def violations(found: list[Edge], package: str) -> list[str]:
    """The edges the table does not allow, one line each: ``source:line -> target (why)``."""
    out = []
    for edge in found:
        source, target = group_of(edge.source, package), group_of(edge.target, package)
        where = f"{edge.source}:{edge.line} -> {edge.target}"
        if source not in ALLOWED:
            out.append(f"{where} ({source} is not in the table)")
        elif source == target:
            continue
        elif target not in ALLOWED[source]:
            out.append(f"{where} ({source} may not import {target})")
        elif edge.eager and (source, target) in DEFERRED_ONLY:
            out.append(f"{where} ({source} imports {target} only inside a function)")
    return out


def render_table() -> str:
    """The table as ``docs/architecture.md`` shows it (Markdown)."""
    rows = ["| group | may import |", "|---|---|"]
    for group, allowed in ALLOWED.items():
        label = LABELS.get(group, f"`{group}`")
        names = ", ".join(
            f"{target} (deferred)" if (group, target) in DEFERRED_ONLY else target
            for target in allowed
        )
        rows.append(f"| {label} | {names or 'only each other'} |")
    return "\n".join(rows)


# --- the checker on a fake tree ------------------------------------------------------------------


FAKE = {
    "pkg/__init__.py": "from ._runtime import open_runtime\n",
    "pkg/_errors.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._agent import A\n"
    ),
    "pkg/_runtime.py": (
        "from ._agent import A\n"
        "from . import otel\n"  # eager: refused
        "def trace():\n    from .otel import trace_runtime\n"
    ),
    "pkg/otel.py": "from .events import E\n",
    "pkg/events.py": "E = 1\n",
    "pkg/_agent/__init__.py": "from .driver import A\n",
    "pkg/_agent/driver.py": "from ..events import E\nA = E\n",
    "pkg/config/__init__.py": (
        "from ..events import E\n"
        "def deferred():\n    from .._agent.driver import A\n"  # deferred still counts
        "if True:\n    import pkg.stores.url\n"
    ),
    "pkg/stores/__init__.py": "",
    "pkg/stores/url.py": "from .._errors import X\n",
    "pkg/newpkg/__init__.py": "from .. import events\n",
}


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_counts_every_import_and_refuses_edges_off_the_table(tmp_path: Path) -> None:
    _write(tmp_path, FAKE)
    found = edges(tmp_path, "pkg")
    by_source: dict[tuple[str, str], Edge] = {}
    for edge in found:
        by_source.setdefault((edge.source, edge.target), edge)
    assert not by_source[("pkg._errors", "pkg._agent")].eager  # TYPE_CHECKING: counted, not eager
    assert not by_source[("pkg.config", "pkg._agent.driver")].eager
    assert by_source[("pkg._runtime", "pkg.otel")].eager  # the first one, at module level
    assert ("pkg._agent", "pkg._agent.driver") in by_source  # inside a group: seen, not checked
    assert violations(found, "pkg") == [
        "pkg._errors:3 -> pkg._agent (base may not import _agent)",
        "pkg._runtime:2 -> pkg.otel (runtime imports otel only inside a function)",
        "pkg.config:3 -> pkg._agent.driver (config may not import _agent)",
        "pkg.config:5 -> pkg.stores.url (config may not import stores)",
        "pkg.newpkg:1 -> pkg.events (newpkg is not in the table)",
    ]


def test_the_checker_accepts_a_deferred_import_where_the_table_asks_for_one(
    tmp_path: Path,
) -> None:
    files = {k: v for k, v in FAKE.items() if not k.startswith(("pkg/config", "pkg/newpkg"))}
    files["pkg/_runtime.py"] = "def trace():\n    from .otel import trace_runtime\n"
    files["pkg/_errors.py"] = "X = 1\n"
    _write(tmp_path, files)
    assert violations(edges(tmp_path, "pkg"), "pkg") == []


def test_every_group_the_table_names_may_import_only_groups_of_the_table() -> None:
    for group, allowed in ALLOWED.items():
        assert group not in allowed, group
        assert set(allowed) <= set(ALLOWED), group
    order = list(ALLOWED)
    for group, allowed in ALLOWED.items():  # the table is written top to bottom
        assert all(order.index(t) > order.index(group) for t in allowed), group


# --- the package ------------------------------------------------------------------------------


def test_the_package_imports_only_along_the_table() -> None:
    found = edges(SRC, PACKAGE)
    assert len(found) > 300, "the reader sees too few imports"
    groups = {group_of(e.source, PACKAGE) for e in found}
    assert {"_agent", "config", "llm", "mcp", "stores", "runtime", "base"} <= groups
    bad = violations(found, PACKAGE)
    assert not bad, "imports the table does not allow:\n" + "\n".join(bad)


def test_every_module_belongs_to_a_group_of_the_table() -> None:
    groups = {group_of(name, PACKAGE) for name in discover(SRC, PACKAGE)}
    assert groups <= set(ALLOWED), sorted(groups - set(ALLOWED))
    missing = [
        name for name in (*BASE, *COMPOSITION) if not (SRC / PACKAGE / f"{name}.py").exists()
    ]
    assert not missing, f"the table names modules that do not exist: {missing}"


def test_the_docs_show_the_table() -> None:
    table = render_table()
    assert table in ARCHITECTURE.read_text(encoding="utf-8"), (
        f"docs/architecture.md must show the package table as tests/test_packages.py has it:\n"
        f"{table}"
    )
