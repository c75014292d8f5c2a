"""The MAD table's choices shown beside it: the reported epoch (lowest test perplexity or last evaluation), both
selective-copy variants with their averages, and one seed count per header (a cell of one seed shows no spread)."""

import csv
import math

import pytest
from mixlab import models
from mixlab.analysis.aggregate import (
    AVERAGE,
    COPY16_AVERAGE,
    LAST_EVAL,
    LOWEST_PPL,
    Stats,
    load_sweep,
    mad_scores,
    run_rows,
    selected_metrics,
)
from mixlab.analysis.report import write_report
from mixlab.analysis.tables import (
    REFERENCE,
    fmt_stats,
    mad_entry,
    mad_epoch_moves,
    mad_epoch_setting_moves,
    mad_epoch_table,
    mad_table,
)
from test_aggregate import MAD_TASKS, cells, mad_record, manifest_for, record, write_sweep

SPEC = {"protocol": "mad", "model": "transformer", "model_fields": models.PRESETS["transformer"],
        "profile": {"name": "paper"}, "profile_text": "profile paper", "seeds": [0, 1, 2], "metric": "acc_macro"}


def meta(task, setting, lr, seed):
    return {"task": task, "setting": setting, "model": "transformer", "model_grid": {},
            "train_grid": {"lr": lr, "weight_decay": 0.0}, "seed": seed}


def mad_folder(folder, histories, spec=SPEC):
    """A MAD folder of baselines: ``histories`` maps (task, lr, seed) to a run's (perplexity, accuracy) list."""
    records = [mad_record(task, "baseline", history, lr=lr, seed=seed)
               for (task, lr, seed), history in histories.items()]
    metas = [meta(task, "baseline", lr, seed) for task, lr, seed in histories]
    return write_sweep(folder, records, manifest_for(records, metas, "mad", spec))


# ---- the reported epoch


def test_the_last_evaluation_is_the_histories_last_whatever_its_perplexity():
    rec = record("r", "mqar", {}, 10, [(3.0, 0.9), (2.0, 0.6), (2.5, 0.7)])
    assert selected_metrics(rec, LAST_EVAL)["epoch"] == 3
    assert selected_metrics(rec, LOWEST_PPL)["epoch"] == 2
    bare = {**rec, "history": []}  # its final is the lowest perplexity's: not the last evaluation
    assert math.isnan(run_rows([bare], rule=LAST_EVAL)[0]["acc_macro"])
    assert run_rows([bare])[0]["acc_macro"] == 0.6
    with pytest.raises(ValueError, match="unknown epoch rule 'best'"):
        selected_metrics(rec, "best")


@pytest.fixture
def epoch_dir(tmp_path):
    """Six baselines x lr {1e-4, 1e-3} x seeds 0-2. Every run's perplexity is lowest at its second of three
    evaluations. In-context recall: lr 1e-3 reads 0.30 there and 0.13 last (it overfits), lr 1e-4 0.28 there and
    0.36 last, so the rule changes both the score and the grid point. Compression gains 0.02 after its lowest
    perplexity, memorization 0.005; the other tasks read the same at both."""
    moves = {"mad/in_context_recall": {1e-3: (0.30, 0.13), 1e-4: (0.28, 0.36)},
             "mad/compression": {1e-3: (0.40, 0.42), 1e-4: (0.30, 0.31)},
             "mad/memorization": {1e-3: (0.80, 0.805), 1e-4: (0.70, 0.70)}}
    histories = {}
    for task in MAD_TASKS:
        for lr in (1e-4, 1e-3):
            for seed in range(3):
                at_lowest, last = moves.get(task, {}).get(lr, (0.9 if lr == 1e-3 else 0.8,) * 2)
                histories[(task, lr, seed)] = [(3.0, 0.05), (1.0, at_lowest + 0.01 * seed), (2.0, last + 0.01 * seed)]
    return mad_folder(tmp_path / "epochs", histories)


def test_the_mad_table_at_the_last_evaluation_chooses_its_grid_point_again(epoch_dir):
    entry = mad_entry(load_sweep(epoch_dir))
    recall = "In-Context Recall"
    assert entry.scores.per_seed[recall] == pytest.approx({0: 0.30, 1: 0.31, 2: 0.32})  # lr 1e-3
    assert entry.last.per_seed[recall] == pytest.approx({0: 0.36, 1: 0.37, 2: 0.38})  # lr 1e-4, not 0.13
    assert {r["lr"] for r in entry.last.per_setting if r["task"] == "mad/in_context_recall"} == {1e-4}
    table = mad_epoch_table([entry]).markdown()
    assert cells(table, "Task") == ["Task", "transformer (paper, n=3): lowest ppl", "last eval", "moved"]
    assert cells(table, recall) == [recall, "0.310 [0.010]", "0.370 [0.010]", "+0.060"]
    assert cells(table, "Compress") == ["Compress", "0.410 [0.010]", "0.430 [0.010]", "+0.020"]
    assert cells(table, "Fuzzy Recall")[3] == "+0.000"


def test_the_cells_and_settings_the_rule_moves_past_the_threshold_are_listed(epoch_dir):
    entry = mad_entry(load_sweep(epoch_dir))
    moved = mad_epoch_moves([entry])
    # recall +0.060 and compression +0.020 move the average by (0.06 + 0.02 + 0.005) / 6 = 0.014 (both variants);
    # memorization's +0.005 stays under 0.01
    assert [row[1] for row in moved.rows] == ["Compress", "In-Context Recall", AVERAGE, COPY16_AVERAGE]
    assert moved.rows[0] == ["transformer (paper, n=3)", "Compress", "0.410", "0.430", "+0.020"]
    assert mad_epoch_moves([entry], threshold=0.1) is None
    settings = mad_epoch_setting_moves([entry])
    assert [row[1:4] for row in settings.rows] == [["Compress", "baseline", "3"],
                                                   ["In-Context Recall", "baseline", "3"]]
    assert settings.rows[1][4:] == ["0.310", "0.370", "+0.060"]
    assert [row[1] for row in mad_epoch_setting_moves([entry], threshold=0.004).rows] == [
        "Compress", "In-Context Recall", "Memorize"]


def test_the_report_prints_both_epochs_and_writes_them_long(epoch_dir, tmp_path):
    out = tmp_path / "report"
    write_report([epoch_dir], out)
    report = (out / "report.md").read_text()
    section = report.split("### The reported epoch")[1].split("### Per setting")[0]
    assert cells(section, "In-Context Recall")[1:] == ["0.310 [0.010]", "0.370 [0.010]", "+0.060"]
    assert "Cells the rule moves by more than 0.01:" in section and "| transformer (paper, n=3) | Compress" in section
    with (out / "mad_epochs.csv").open() as f:
        rows = {(r["task"], r["epoch"]): r for r in csv.DictReader(f)}
    assert float(rows[("In-Context Recall", LAST_EVAL)]["median"]) == pytest.approx(0.37)
    assert float(rows[("In-Context Recall", LOWEST_PPL)]["median"]) == pytest.approx(0.31)
    assert len(rows) == 2 * 9  # six tasks, the 16-copied variant, both averages; under each rule


# ---- both selective-copy variants, both averages


def test_the_average_under_the_16_copied_variant_swaps_only_selective_copys_score():
    copy = "mad/selective_copy"
    accs = {"baseline": 0.9, "vocab_size=32": 0.5, "num_tokens_to_copy=32": 0.1}
    records = [mad_record(copy, setting, [(1.0, acc)], seed=0) for setting, acc in accs.items()]
    records += [mad_record(task, "baseline", [(1.0, 0.6)], seed=0) for task in MAD_TASKS if task != copy]
    # seed 1 has every task but no selective copy baseline: an average, and no variant
    records += [mad_record(task, "baseline", [(1.0, 0.6)], seed=1) for task in MAD_TASKS if task != copy]
    records.append(mad_record(copy, "vocab_size=32", [(1.0, 0.3)], seed=1))
    scores = mad_scores(run_rows(records))
    honoured, copied16 = (0.9 + 0.5 + 0.1) / 3, (0.9 + 0.5 + 0.9) / 3
    assert scores.per_seed[AVERAGE][0] == pytest.approx((5 * 0.6 + honoured) / 6)
    assert scores.copy16_average == pytest.approx({0: (5 * 0.6 + copied16) / 6})
    assert sorted(scores.per_seed[AVERAGE]) == [0, 1]


def test_the_table_prints_both_averages_against_the_papers_average(tmp_path):
    histories = {(task, 1e-3, seed): [(1.0, 0.5 + 0.01 * seed)] for task in MAD_TASKS for seed in range(3)}
    entry = mad_entry(load_sweep(mad_folder(tmp_path / "avg", histories)))
    table = mad_table([entry]).markdown()
    paper = REFERENCE["transformer"][AVERAGE]
    # every setting of the fixture is a baseline, so the two variants agree here
    assert cells(table, COPY16_AVERAGE) == [COPY16_AVERAGE, "0.510 [0.010]", f"{paper:.3f}", f"{0.51 - paper:+.3f}"]
    assert cells(table, AVERAGE)[1:] == cells(table, COPY16_AVERAGE)[1:]


# ---- one seed count per header


def test_one_seed_shows_its_value_alone():
    assert fmt_stats(Stats.of([0.469])) == "0.469"
    assert fmt_stats(Stats.of([0.4, 0.5, 0.6])) == "0.500 [0.100]"
    assert fmt_stats(Stats.of([])) == "—"


def test_a_column_of_mixed_seed_counts_labels_each_cell_with_its_own(tmp_path):
    """Memorization with seeds 0-2, the other tasks with seed 0 only (the paper profile under way)."""
    histories = {(task, 1e-3, seed): [(1.0, 0.5 + 0.01 * seed)] for task in MAD_TASKS
                 for seed in (range(3) if task == "mad/memorization" else [0])}
    entry = mad_entry(load_sweep(mad_folder(tmp_path / "mixed", histories)))
    assert entry.label == "transformer (paper)" and entry.seeds is None
    table = mad_table([entry]).markdown()
    assert cells(table, "Task")[1] == "transformer (paper)"
    assert cells(table, "Memorize")[1] == "0.510 [0.010], n=3"
    compress = cells(table, "Compress")[1]
    assert compress.startswith("0.500, n=1") and "[" not in compress
    assert cells(table, AVERAGE)[1].startswith("0.500, n=1")
    epochs = mad_epoch_table([entry]).markdown()
    assert cells(epochs, "Compress")[1].startswith("0.500, n=1") and "[" not in cells(epochs, "Compress")[2]


def test_a_column_of_one_seed_count_gives_it_in_its_header_only(tmp_path):
    histories = {(task, 1e-3, 0): [(1.0, 0.5)] for task in MAD_TASKS}
    entry = mad_entry(load_sweep(mad_folder(tmp_path / "one", histories, spec={**SPEC, "seeds": [0]})))
    assert entry.label == "transformer (paper, n=1)" and entry.seeds == 1
    table = mad_table([entry]).markdown()
    assert cells(table, "Compress")[1] == "0.500" and cells(table, AVERAGE)[1] == "0.500"
