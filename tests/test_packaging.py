"""The install layout: the six top-level folders are the packages ``mixlab.<folder>``, nothing is installed under
a generic top-level name, every import of ours goes through ``mixlab.``, and no two of our modules import each
other, directly or round a longer circle."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "tasks", "models", "kernels", "runners", "analysis")


def _python_sources() -> dict[str, str]:
    """Every Python text of the repository that could import ours: modules, tests, scripts, the example plugin
    and the notebooks' code cells. Path -> source."""
    out = {}
    for folder in (*PACKAGES, "tests", "scripts", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            out[str(path.relative_to(ROOT))] = path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out[str(path.relative_to(ROOT))] = "\n".join(line for line in code.splitlines() if not line.startswith("%"))
    return out


def _imported_names(tree: ast.AST) -> list[tuple[str, int]]:
    """(dotted module name, line) of every absolute import in ``tree``; ``from a import b`` gives ``a.b``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def test_every_import_of_ours_is_under_mixlab():
    bare = []
    for path, source in _python_sources().items():
        for name, line in _imported_names(ast.parse(source)):
            if name.split(".")[0] in PACKAGES:
                bare.append(f"{path}:{line} imports {name}")
    assert bare == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["mixlab", *parts])


def test_no_import_circle_between_our_modules():
    """Every import counts, also one inside a function or under TYPE_CHECKING: a circle hidden by a late import
    is still two modules that cannot be read apart."""
    modules = {_module_name(p): p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported, _ in _imported_names(ast.parse(path.read_text())):
            # `from mixlab.kernels import utils` names the module mixlab.kernels.utils; `... import short_conv`
            # (a function) names its package.
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets

    # Tarjan's strongly connected components: any component of two or more modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def _outside_checkout_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONSAFEPATH"] = "1"  # the working directory is not put on sys.path
    return env


@pytest.mark.parametrize("name", PACKAGES)
def test_no_generic_top_level_package_is_installed(name, tmp_path):
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, env=_outside_checkout_env(),
                          capture_output=True, text=True)
    assert proc.returncode != 0 and f"No module named '{name}'" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-c", f"import mixlab.{name}"], cwd=tmp_path,
                          env=_outside_checkout_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_wheel_holds_only_mixlab_and_runs(tmp_path):
    """A plain (non-editable) wheel: every module of the six folders under ``mixlab/``, nothing else beside its
    metadata, the presets as package data, and ``mixlab tasks list`` runs from it alone."""
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(ROOT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = tmp_path.glob("mixlab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not (n.startswith("mixlab/") or n.split("/")[0].endswith(".dist-info"))]
    assert outside == []
    expected = {f"mixlab/{p.relative_to(ROOT).as_posix()}" for folder in PACKAGES
                for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts}
    assert expected - set(names) == set()

    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                              str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stdout + install.stderr
    env = _outside_checkout_env()
    env["PYTHONPATH"] = str(site)
    where = subprocess.run([sys.executable, "-c", "import mixlab.tasks; print(mixlab.tasks.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.returncode == 0 and where.stdout.startswith(str(site)), where.stdout + where.stderr
    listed = subprocess.run([str(site / "bin" / "mixlab"), "tasks", "list"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert "mqar_varlen" in listed.stdout and "mad/compression" in listed.stdout
