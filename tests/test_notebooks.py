"""Every notebook runs top to bottom in its small mode, in a kernel of this interpreter, and is committed clean."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
IDS = [path.stem for path in NOTEBOOKS]


def test_the_three_notebooks_exist():
    assert set(IDS) >= {"inspect_representations", "mad_table", "leakage"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, "a notebook without code"
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]
    assert notebook.metadata["kernelspec"]["name"] == "python3"


@pytest.fixture
def kernel_of_this_interpreter(tmp_path, monkeypatch):
    """A "python3" kernelspec that runs this interpreter in small mode, writing under tmp_path; found first
    through JUPYTER_PATH (restored after the test), so the kernel sees this environment's packages."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "mixlab test kernel", "language": "python",
            "env": {"MIXLAB_NOTEBOOK_SMALL": "1", "MIXLAB_NOTEBOOK_OUT": str(tmp_path / "out")}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return tmp_path / "out"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_in_small_mode(path, kernel_of_this_interpreter):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, kernel_name="python3", timeout=240,
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    kernel_manager = client.create_kernel_manager()
    assert kernel_manager.kernel_spec.argv[0] == sys.executable, "the fixture's kernelspec is the one found"
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert [out for out in outputs if "image/png" in out.get("data", {})], "every notebook shows a figure"
    assert any(kernel_of_this_interpreter.rglob("*.*")), "the kernel wrote under MIXLAB_NOTEBOOK_OUT"


def _readme_notebook_command() -> str:
    """The README's one command that executes the notebooks."""
    readme = (NOTEBOOKS_DIR.parent / "README.md").read_text()
    return next(line for line in readme.splitlines() if "jupyter nbconvert" in line)


def test_the_notebooks_extra_brings_what_the_readme_command_runs():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((NOTEBOOKS_DIR.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0) for requirement in extras["notebooks"]}
    assert {"nbclient", "nbformat", "ipykernel", "nbconvert"} <= names
    assert "mixlab[notebooks]" in extras["test"], "the tests execute the notebooks too"
    assert _readme_notebook_command().startswith('pip install -e ".[notebooks]" && jupyter nbconvert ')


def test_readme_command_executes_a_notebook(kernel_of_this_interpreter, tmp_path):
    """The nbconvert half of the README command, on one notebook, in this interpreter's small-mode kernel."""
    args = shlex.split(_readme_notebook_command().split(" && ", 1)[1])
    assert args[:2] == ["jupyter", "nbconvert"] and "notebooks/*.ipynb" in args
    args[args.index("notebooks/*.ipynb")] = str(NOTEBOOKS_DIR / "mad_table.ipynb")
    args[args.index("--output-dir") + 1] = str(tmp_path / "executed")
    subprocess.run([sys.executable, "-m", "nbconvert", *args[2:]], check=True, capture_output=True, timeout=600)
    executed = nbformat.read(tmp_path / "executed" / "mad_table.ipynb", as_version=4)
    assert all(cell.execution_count for cell in executed.cells if cell.cell_type == "code")
