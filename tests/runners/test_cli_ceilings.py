"""``mixlab ceilings``: the ceiling table of a sweep preset's mqar_varlen settings (analysis.ceilings)."""

from mixlab.runners.cli.main import main


def test_ceilings_of_a_preset_print_a_row_per_window(capsys):
    main(["ceilings", "--preset", "mqar_varlen_small", "--windows", "4,5", "--rows", "50", "--seeds", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[-1].endswith("| 5 | 1.0000 |")
    assert lines[2].startswith("| mqar_varlen_small | {'vocab_size': 128, 'seq_len': 64, 'num_kv_pairs': 4")
