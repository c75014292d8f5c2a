"""``mixlab bench rubiconv`` at a tiny shape (the Triton interpreter without CUDA): every exact row passes its gate
and gets timings, the Triton rows come twice (sizes shared the second time), and the setting the second set turns
on is back as shipped afterwards."""

import pytest
import torch
from mixlab.kernels.rubiconv import gemm
from mixlab.runners.bench import rubiconv as bench


def _rows(text: str) -> dict[str, list[str]]:
    """label -> the other cells of its table row."""
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {row[0]: row[1:] for row in cells}


@pytest.mark.usefixtures("one_torch_thread")
def test_the_triton_rows_with_shared_sizes_pass():
    shipped = gemm.MERGE_FILTER_COST
    rows = _rows(bench.bench_rubiconv(n_tokens=64, d=1, repeats=1, device="cpu"))
    assert shipped == gemm.MERGE_FILTER_COST
    for precision in ("fp32", "bf16"):
        own, sizes_shared = rows[f"triton {precision}, k=16"], rows[f"triton {precision}, k=16, sizes shared"]
        assert own[-2] == sizes_shared[-2] == "PASS"
        assert all(float(ms) > 0 for ms in own[:2] + sizes_shared[:2])
    for label, cells in rows.items():
        if cells[-2] != "leaks":
            assert cells[-2] == "PASS", label
        # the modeled work: on the GEMM form's rows only
        assert (cells[-1] != "—") == label.startswith(("gemm", "triton")), label


def test_a_shorter_median_cuts_the_row_into_more_and_shorter_documents():
    cpu = torch.device("cpu")
    default, short = bench.lognormal_layout(65536, 0, cpu), bench.lognormal_layout(65536, 0, cpu, median=64)
    assert default[-1] == short[-1] == 65536 and default[0] == short[0] == 0
    assert torch.equal(default, bench.lognormal_layout(65536, 0, cpu, median=None))
    assert len(short) > 5 * len(default)
    assert 40 <= short.diff().float().median() <= 100  # median 64, but the row's last document is cut to fit


def test_bench_rubiconv_names_a_bad_median_length(capsys):
    from mixlab.runners.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "rubiconv", "--median-length", "0", "--n-tokens", "64", "--d", "1"])
    err = capsys.readouterr().err
    assert exc.value.code != 0
    assert "median_length" in err and len(err.strip().splitlines()) == 1
