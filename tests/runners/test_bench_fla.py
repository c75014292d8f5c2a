"""``mixlab bench fla`` at a tiny shape (the Triton interpreter without CUDA): one table per op and row length,
each kernel form gated against the float64 torch path before it is timed."""

import re

import pytest
import torch
from mixlab.models.mixers import fla_ops

pytestmark = [
    pytest.mark.skipif(not fla_ops.fla_available(), reason=f"fla-core is not installed ({fla_ops.INSTALL_HINT})"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's Triton interpreter; on a GPU the real run"),
]
TINY = {"seq_lens": (7,), "ops": ("gla",), "n_heads": 2, "head_dim": 4, "value_dim": 6, "tokens": 21,
        "repeats": 1, "device": "cpu"}


def rows(text):
    return {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith("| chunk") or line.startswith("| recurrent")}


def test_each_form_is_gated_then_timed_and_the_header_names_the_versions():
    from mixlab.runners.bench.fla import bench_fla

    text = bench_fla(**TINY)
    assert re.search(r"- device: CPU \(Triton interpreter\); torch .*, fla-core \d", text)
    assert "## gla, T = 7: B = 3 rows, 21 tokens" in text
    table = rows(text)
    assert set(table) == {"chunk", "recurrent"}
    gate, fwd, total = table["recurrent"][1:4]
    assert float(gate) <= 1e-2 and float(fwd) > 0 and float(total) > 0  # bf16 against float64


def test_a_form_failing_its_gate_gets_no_timings(monkeypatch):
    from mixlab.runners.bench import fla as bench_fla

    monkeypatch.setattr(bench_fla, "_gate", lambda op, form, inputs, upstream: 0.5 if form == "recurrent" else 0.0)
    monkeypatch.setattr(bench_fla, "measure_pair", lambda fwd, total, repeats, device: (1.0, 2.0, ""))
    table = rows(bench_fla.bench_fla(**TINY))
    assert table["recurrent"][1:4] == ["FAIL 5.0e-01", "—", "—"]
    assert table["chunk"][2:4] == ["1.0", "2.0"]


@pytest.mark.parametrize(("change", "message"), [({"ops": ("based",)}, "op 'based' has one kernel form only"),
                                                 ({"tokens": 10**6}, "too many for the Triton interpreter"),
                                                 ({"head_dim": 0}, "head_dim"), ({"dtype": "int8"}, "dtype")],
                         ids=["one-form-op", "too-many-tokens", "zero-head", "bad-dtype"])
def test_bad_settings_are_refused_in_one_line(change, message):
    from mixlab.runners.bench.fla import bench_fla

    with pytest.raises(ValueError, match=message):
        bench_fla(**{**TINY, **change})
