"""The GPU tune scripts' candidates stay in step with the kernels: each names constants its module has, with
one value per constant, and each group's first candidate is what the repository ships (the scripts time the
shipped setting first, and a candidate that outlived a renamed constant would only fail on the GPU)."""

import ast
import importlib
from pathlib import Path

import pytest
import torch
from kernel_checks import assert_close, cu_from_rows

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _groups(name: str, monkeypatch) -> list[tuple]:
    """(group, module, constant names, candidates) of scripts/<name>.py."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    script = importlib.import_module(name)
    return [(group, script.rubi, consts, candidates) for group, _kernel, consts, candidates in script.GROUPS]


@pytest.mark.parametrize("name", ["tune_rubiconv_gpu"])
def test_candidates_name_shipped_constants_first(name, monkeypatch):
    pytest.importorskip("triton")
    for group, module, consts, candidates in _groups(name, monkeypatch):
        assert all(hasattr(module, c) for c in consts), group
        assert all(len(values) == len(consts) for values in candidates), group
        assert tuple(getattr(module, c) for c in consts) == candidates[0], group
        assert len(set(candidates)) == len(candidates), group


def test_rubiconv_candidates_stay_exact(monkeypatch):
    """Every RubiConv tile candidate gives y, dx and dh of the float64 reference (interpreter, exact fp32 dots)
    on a row whose longest document has more half columns (36) and columns (71) than one tile of any candidate
    holds (k=16, the block stages' candidates), and on one at k=64, where the F_k stage's chunks of frequency rows
    differ between candidates (the spectrum kernel's; the large-k group's there too, its threshold lowered to 64): a
    tile that drops or repeats work fails before the GPU times it."""
    pytest.importorskip("triton")
    from mixlab import kernels
    from mixlab.kernels import triton_utils as tu

    monkeypatch.setattr(tu, "POISON_OUTPUTS", True)
    gen = torch.Generator().manual_seed(0)
    # (T, D, L_F, document lengths, block k)
    rows = [(600, 3, 600, [37, 563], 16), (130, 2, 20, [3, 127], 64)]
    cases = []
    for T, D, L_F, lengths, block in rows:
        x, h, dy = (torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in ((1, T, D), (D, L_F),
                                                                                         (1, T, D)))
        cases.append((x, h, dy, cu_from_rows([lengths], T), block))

    def run(case: tuple, dtype: torch.dtype, backend: str) -> list[torch.Tensor]:
        x, h, dy, cu, block = case
        xl, hl = x.to(dtype).requires_grad_(), h.to(dtype).requires_grad_()
        y = kernels.rubiconv(xl, hl, cu_seqlens=cu, block=block, backend=backend)
        return [y, *torch.autograd.grad(y, (xl, hl), dy.to(dtype))]

    wants = [run(case, torch.float64, "torch") for case in cases]
    for group, module, consts, candidates in _groups("tune_rubiconv_gpu", monkeypatch):
        rows_of_group = [1] if group.startswith("spectrum") else [0]
        monkeypatch.setattr(module, "SPECTRUM_LARGE_K", 64 if group == "spectrum large k" else 1 << 30)
        for values in candidates:
            for name, value in zip(consts, values, strict=True):
                monkeypatch.setattr(module, name, value)
            for case, want in [(cases[i], wants[i]) for i in rows_of_group]:
                for out, got, expected in zip(("y", "dx", "dh"), run(case, torch.float32, "triton"), want,
                                              strict=True):
                    assert_close(got, expected.float(), 1e-5, f"{group} {values}, k={case[-1]}: {out}")
        for name, value in zip(consts, candidates[0], strict=True):
            monkeypatch.setattr(module, name, value)


def test_rubiconv_tune_script_runs_in_the_interpreter(monkeypatch, capsys):
    """scripts/tune_rubiconv_gpu.py end to end on a tiny row (``--device cpu``): every candidate of a group is
    timed and passes its error gate, the best one's values come out as the constants to set, and the table at the
    end times every launch of a forward and backward. The script sets the module's constants as it tunes: they
    are put back afterwards."""
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(SCRIPTS))
    script = importlib.import_module("tune_rubiconv_gpu")
    for _group, _kernel, names, _candidates in script.GROUPS:
        for name in names:
            monkeypatch.setattr(script.rubi, name, getattr(script.rubi, name))
    assert script.main(["--device", "cpu", "--tokens", "64", "--d", "4", "--blocks", "16", "--rep", "1",
                        "--only", "block inv"]) == 0
    out = capsys.readouterr().out
    assert "WRONG" not in out and "FAILED" not in out
    _, _, consts, candidates = next(g for g in script.GROUPS if g[0] == "block inv")
    lines = [line for line in out.splitlines() if line.startswith(("* ", "  ("))]
    assert len(lines) == len(candidates)
    best = [ast.literal_eval(line[2:].split(":")[0]) for line in lines if line.startswith("* ")]
    assert len(best) == 1 and best[0] in candidates
    chosen = ", ".join(f"{n} = {v}" for n, v in zip(consts, best[0], strict=True))
    assert f"mixlab.kernels.rubiconv.triton: {chosen}" in out
    launches = [line for line in out.splitlines() if line.startswith("| fp32 k=16 | _rubi_")]
    assert len(launches) == 10
    assert script.main(["--only", "nope"]) == 2
