"""The repository explains itself: no citation of a document it does not hold, every linked page exists, and the
README's first lines and its Python quickstart work as written."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the word SPEC followed by a section number (optionally "section" between): a design document kept outside the
# repository, which nothing here may cite
OUTSIDE_CITATION = re.compile(rb"\bSPEC\b(\s+section)?\s+\d")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = "```"


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name]


def test_nothing_outside_docs_cites_sections_of_an_outside_document():
    found = []
    for name in _tracked_files():
        if name.startswith("docs/") or not (ROOT / name).is_file():
            continue
        data = (ROOT / name).read_bytes()
        if not OUTSIDE_CITATION.search(data):
            continue
        text = data.decode(errors="replace")
        found += [f"{name}:{number}: {line.strip()[:100]}" for number, line in enumerate(text.splitlines(), 1)
                  if OUTSIDE_CITATION.search(line.encode())]
    assert found == [], "cite a page of docs/ instead:\n" + "\n".join(found)


def _local_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(page.read_text()) if "://" not in target and not target.startswith("#")]


@pytest.mark.parametrize("page", ["README.md", "docs/README.md"])
def test_every_linked_page_exists(page):
    missing = [target for target in _local_links(ROOT / page)
               if not (ROOT / page).parent.joinpath(target.split("#")[0]).exists()]
    assert missing == [], f"{page} links to missing files: {missing}"


def test_the_docs_index_lists_every_docs_page():
    linked = {target.split("#")[0] for target in _local_links(ROOT / "docs" / "README.md")}
    pages = {path.name for path in (ROOT / "docs").glob("*.md") if path.name != "README.md"}
    assert pages <= linked, f"docs/README.md does not link {sorted(pages - linked)}"


def test_readme_opens_with_the_title_then_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[0] == "# mixlab"
    block = lines[lines.index("```bash"):]
    run, test = block.index("# Install and run the main job (small CPU default):"), block.index(
        "# Install and run the tests:")
    assert block[run + 1].startswith("pip install ") and " && mixlab run " in block[run + 1]
    assert block[test + 1].startswith("pip install ") and block[test + 1].endswith("python -m pytest -q")
    assert lines.index("```bash") < 6, "the commands come right after the title and its one-line description"


def _quickstart() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python quickstart", 1)[1]
    return section.split("```python\n", 1)[1].split("\n" + FENCE, 1)[0]


def test_readme_quickstart_runs(capsys, one_torch_thread):
    code = _quickstart()
    assert len(code.splitlines()) <= 20, "a quickstart of about a dozen lines"
    exec(compile(code, "README.md (Python quickstart)", "exec"), {"__name__": "readme_quickstart"})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "torch.Size([8, 48, 64])"
    assert 0.0 <= float(printed[1]) <= 1.0
    assert printed[2] == "leaks (declared) / exact"
