"""``mixlab compare``: mixers side by side on one task, as a sweep that resumes, with a table per mixer and a
verdict per pair from the claims machinery."""

import pytest
from cli_run import run_cli
from mixlab.analysis import stats
from mixlab.analysis.claims import Claim, Verdict, decide
from mixlab.analysis.compare import Pair
from mixlab.runners.sweep.spec import compare_spec

TINY = ["--set", "seq_len=16", "--set", "num_kv_pairs=2", "--set", "vocab_size=32", "--set", "d_model=16",
        "--set", "n_heads=2", "--set", "n_layers=1", "--set", "num_train=16", "--set", "num_test=8",
        "--set", "batch_size=8", "--steps", "2", "--device", "cpu", "--no-progress"]


def test_compare_trains_each_mixer_per_seed_tabulates_and_resumes(capsys, tmp_path, one_torch_thread):
    folder = tmp_path / "cmp"
    argv = ["compare", "mqar", "--mixers", "attention,static_conv", "--seeds", "3", *TINY, "--out", str(folder)]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"6 runs: 0 already done, 6 run now -> {folder}"
    assert lines[1] == "# attention, static_conv on mqar"
    header = next(line for line in lines if line.startswith("| mixer"))
    assert header.split("|")[2:5] == [" acc_micro median [IQR] ", " solved (>= 0.99) ", " n "]
    first = [line.split("|")[1].strip() for line in lines if line.startswith("|")]
    assert first[2:4] == ["attention", "static_conv"] and first[6] == "attention - static_conv"
    (pair,) = [line for line in lines if line.startswith("| attention - static_conv")]
    assert pair.split("|")[4].strip() == "3"  # seeds both have
    assert {p.name for p in folder.iterdir()} >= {"sweep.json", "runs", "compare.md", "compare.png",
                                                  "compare_curves.png"}
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and out.startswith(f"6 runs: 6 already done, 0 run now -> {folder}")


def verdict(values):
    """The claims machinery's verdict on a - b > 0 for per-seed differences ``values``."""
    claim = Claim(text="a - b", difference=("a", "b"), op=">")
    if len(values) < 3:
        return Verdict(claim, {}, "acc", len(values), verdict="inconclusive", note="too few seeds")
    interval = stats.bootstrap_median(values)
    return Verdict(claim, {}, "acc", len(values), 0.0, interval, None, decide(claim, interval))


@pytest.mark.parametrize("values,outcome", [
    ([0.1, 0.2, 0.3], "a better"),
    ([-0.1, -0.2, -0.3], "b better"),
    ([-0.1, 0.0, 0.2], "no clear difference"),
    ([-0.1, 0.0, 0.0], "a not better"),
    ([0.1, 0.2], "no verdict (too few seeds)"),
], ids=["a-better", "b-better", "straddles", "ends-at-zero", "two-seeds"])
def test_a_pair_reads_the_interval_both_ways(values, outcome):
    assert Pair("a", "b", verdict(values)).outcome == outcome


@pytest.mark.parametrize("mixers,model,message", [
    (["attention"], {}, "two or more distinct mixers"),
    (["attention", "attention"], {}, "two or more distinct mixers"),
    (["attention", "hyena"], {"mixer": "hyena"}, "not as the model field mixer"),
], ids=["one", "twice", "mixer-field"])
def test_compare_refuses_what_is_no_comparison(mixers, model, message):
    with pytest.raises(ValueError, match=message):
        compare_spec("mqar", mixers, task_params={}, model=model, train={}, seeds=3)
