"""``scripts/bench/*.py``: thin wrappers around ``dsh_agent_loop.bench``, usable as before.

Run as scripts they run the package module's ``main``; imported as top-level modules with
``scripts/bench`` on ``sys.path`` (as benchmark harnesses do: ``import loop; loop.w1(...)``)
they expose the package module's public names, the very same objects.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "bench"
NAMES = ("loop", "stores", "scale", "compaction", "fleet")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_script_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _public_names(module: ModuleType) -> set[str]:
    """Public names a module defines or takes from ``dsh_agent_loop.bench``, read from source."""
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "dsh_agent_loop.bench"
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return {n for n in names if not n.startswith("_")}


def test_there_is_a_wrapper_for_each_benchmark() -> None:
    assert sorted(p.stem for p in SCRIPTS.glob("*.py")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_wrapper_exposes_the_package_module_public_names(name: str) -> None:
    script = _load(name)
    package = importlib.import_module(f"dsh_agent_loop.bench.{name}")
    expected = _public_names(package)
    assert expected >= {"main"}
    assert set(script.__all__) == expected
    for attribute in expected:
        assert getattr(script, attribute) is getattr(package, attribute), attribute


@pytest.mark.parametrize("name", NAMES)
def test_a_wrapper_holds_no_code_of_its_own(name: str) -> None:
    tree = ast.parse((SCRIPTS / f"{name}.py").read_text(encoding="utf-8"))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {"__future__", "sys", f"dsh_agent_loop.bench.{name}"}
    assert not [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]


def test_import_loop_from_the_scripts_directory_runs_the_package_w1(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "import loop\n"
        "print(loop.w1.__module__, loop.w1(20, 1) > 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["dsh_agent_loop.bench.loop", "True"]


@pytest.mark.parametrize(
    ("name", "option"),
    [
        ("loop", "--quick"),
        ("stores", "--quick"),
        ("scale", "--gc-freeze"),
        ("compaction", "--messages"),
    ],
)
def test_running_a_wrapper_runs_the_package_main(name: str, option: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    package = importlib.import_module(f"dsh_agent_loop.bench.{name}")
    assert (package.__doc__ or "").splitlines()[0] in " ".join(done.stdout.split())
    assert option in done.stdout
