"""The GPU tune scripts' candidates stay in step with the kernels: each names constants its module has, with
one value per constant, and each group's first candidate is what the repository ships (the scripts time the
shipped setting first, and a candidate that outlived a renamed constant would only fail on the GPU)."""

import importlib
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _groups(name: str, monkeypatch) -> list[tuple]:
    """(group, module, constant names, candidates) of scripts/<name>.py."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    script = importlib.import_module(name)
    if name == "tune_attention_gpu":
        return [(group, script.attn, consts, candidates) for group, consts, candidates in script.GROUPS]
    return [(group, module, consts, candidates) for group, _names, module, consts, candidates in script.GROUPS]


@pytest.mark.parametrize("name", ["tune_shortconv_gpu", "tune_attention_gpu"])
def test_candidates_name_shipped_constants_first(name, monkeypatch):
    pytest.importorskip("triton")
    for group, module, consts, candidates in _groups(name, monkeypatch):
        assert all(hasattr(module, c) for c in consts), group
        assert all(len(values) == len(consts) for values in candidates), group
        assert tuple(getattr(module, c) for c in consts) == candidates[0], group
        assert len(set(candidates)) == len(candidates), group
