"""The install layout: the six top-level folders are the packages ``mixlab.<folder>``, nothing is installed under
a generic top-level name, every import of ours goes through ``mixlab.``, imports point one way (down the layers
from runners to core, and between the rooms of runners), and no two of our modules import each other, directly or
round a longer circle."""

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


# The packages each package may import besides itself, from the base up: what two packages need lives below both.
LAYERS = {
    "core": (),
    "kernels": ("core",),
    "tasks": ("core",),
    "models": ("core", "kernels"),
    "analysis": ("core", "kernels", "tasks", "models"),
    "runners": PACKAGES,
}
# The rooms of runners (its sub-packages and top-level modules) each room may import; other packages as LAYERS says.
ROOMS = {
    "train": (),
    "sweep": ("train",),
    "bench": ("train", "sweep"),
    "check": ("train", "bench"),
    "cli": ("train", "sweep", "bench", "check"),
}


def _absolute_imports(module: str, source: str, *, is_package: bool) -> list[tuple[str, int]]:
    """(dotted name, line) of every import in ``source``, the text of ``module``: at any depth (inside functions and
    TYPE_CHECKING blocks too), relative ones made absolute; ``from a import b`` gives ``a.b``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            prefix = ".".join([*base, *([node.module] if node.module else [])])
            found += [(f"{prefix}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _arrow_error(module: str, imported: str) -> str | None:
    """Why ``module`` may not import ``imported`` (dotted names), or None where it may."""
    src, dst = module.split("."), imported.split(".")
    if dst[0] != "mixlab" or len(dst) < 2 or dst[1] not in PACKAGES:
        return None
    if src[1] != "runners":
        if dst[1] == src[1] or dst[1] in LAYERS[src[1]]:
            return None
        allowed = LAYERS[src[1]]
        return f"{src[1]} may import only {', '.join(allowed)}" if allowed else f"{src[1]} imports no other package"
    if dst[1] != "runners" or len(src) < 3 or len(dst) < 3 or dst[2] == src[2]:
        return None
    if src[2] not in ROOMS:
        return f"runners.{src[2]} is not in ROOMS, which says what each room of runners may import"
    if dst[2] in ROOMS[src[2]]:
        return None
    allowed = ROOMS[src[2]]
    return (f"runners.{src[2]} may import only the rooms {', '.join(allowed)} of runners" if allowed
            else f"runners.{src[2]} imports no other room of runners")


def _arrow_errors(module: str, source: str, *, is_package: bool) -> list[tuple[int, str]]:
    """(line, ``<module> imports <name> (<why not>)``) for each import of ``module`` that points the wrong way."""
    out = []
    for imported, line in _absolute_imports(module, source, is_package=is_package):
        error = _arrow_error(module, imported)
        if error:
            out.append((line, f"{module} imports {imported} ({error})"))
    return out


def test_imports_point_down_the_layers_and_one_way_between_rooms():
    """core imports no other package; kernels and tasks only core; models also kernels; analysis also tasks and
    models, never runners; inside runners, train imports no other room, sweep train, bench train and sweep, check
    train and bench, the cli all of them."""
    wrong = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            errors = _arrow_errors(_module_name(path), path.read_text(), is_package=path.name == "__init__.py")
            wrong += [f"{path.relative_to(ROOT)}:{line}: {error}" for line, error in errors]
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_a_wrong_arrow_is_named_with_its_module_line_and_rule():
    """A late import of runners in an analysis function (relative or absolute), a cli import in the train room and
    a tasks import in core."""
    analysis = "import numpy\n\n\ndef f():\n    from ..runners.train import config\n    import mixlab.runners.sweep\n"
    only = "analysis may import only core, kernels, tasks, models"
    assert _arrow_errors("mixlab.analysis.example", analysis, is_package=False) == [
        (5, f"mixlab.analysis.example imports mixlab.runners.train.config ({only})"),
        (6, f"mixlab.analysis.example imports mixlab.runners.sweep ({only})"),
    ]
    train = "from mixlab.analysis import claims\nfrom mixlab.runners.cli import main\n"
    assert _arrow_errors("mixlab.runners.train.example", train, is_package=False) == [
        (2, "mixlab.runners.train.example imports mixlab.runners.cli.main (runners.train imports no other room of "
            "runners)"),
    ]
    assert _arrow_errors("mixlab.core", "from mixlab.tasks import fields\n", is_package=True) == [
        (1, "mixlab.core imports mixlab.tasks.fields (core imports no other package)"),
    ]


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
