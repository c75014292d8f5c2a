"""The test tree itself: pytest's default import mode needs unique test-file basenames (no __init__.py here)."""

from collections import Counter
from pathlib import Path


def test_test_file_basenames_are_unique():
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
