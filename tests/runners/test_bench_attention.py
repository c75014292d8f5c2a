"""``mixlab bench attention`` at a tiny shape (the Triton interpreter without CUDA): one gated table per row length
with the Triton and SDPA rows, a failing gate withholds the Triton timings, bad input is one line."""

import pytest
import torch
from mixlab.runners.bench import attention as bench
from mixlab.runners.cli.main import main

TINY = {"seq_lens": (5, 20), "n_heads": 2, "head_dim": 8, "tokens": 40, "repeats": 1}


def _table(text: str, T: int) -> list[list[str]]:
    """The cells of the rows of T's table (header and rule left out)."""
    section = text.split(f"## T = {T}:")[1].split("## T =")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "implementation" not in line]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


@pytest.mark.usefixtures("one_torch_thread")
def test_every_length_gets_a_gated_table_of_timings():
    text = bench.bench_attention(**TINY)
    assert "H=2 heads of size 8, bf16" in text and "- device: " in text
    for T, B in ((5, 8), (20, 2)):
        assert f"## T = {T}: B = {B} sequences, {B * T} tokens" in text
        assert "Correctness gate" in text.split(f"## T = {T}:")[1].split("PASS")[0]
        rows = _table(text, T)
        labels = [row[0] for row in rows]
        assert labels[:2] == ["Triton", "Triton, [B, T, H, hd] layout"] and "SDPA math" in labels
        for row in rows:
            fwd_us, total_us = float(row[1]), float(row[2])
            assert fwd_us > 0 and total_us > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_a_failing_gate_withholds_the_triton_timings(monkeypatch):
    monkeypatch.setitem(bench.RMS_BOUND, torch.bfloat16, 0.0)
    text = bench.bench_attention(**{**TINY, "seq_lens": (5,)})
    assert "FAIL" in text
    rows = {row[0]: row for row in _table(text, 5)}
    assert rows["Triton (gate failed)"][1:3] == ["—", "—"]
    assert float(rows["SDPA math"][1]) > 0


@pytest.mark.parametrize(("change", "message"), [
    ({"dtype": "fp8"}, "dtype must be one of"),
    ({"n_heads": 0}, "n_heads must be a positive integer"),
    ({"seq_lens": ()}, "seq_lens must name at least one length"),
    ({"tokens": bench.CPU_MAX_TOKENS + 1, "device": "cpu"}, "too many for the Triton interpreter"),
])
def test_bad_arguments_raise(change, message):
    with pytest.raises(ValueError, match=message):
        bench.bench_attention(**{**TINY, **change})


def test_the_command_turns_bad_input_into_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "attention", "--seq-lens", "128,x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "row lengths, e.g. 128,1024" in err and err.count("\n") == 1
