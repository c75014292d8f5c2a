import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mixlab import models
from mixlab.analysis import plots
from mixlab.analysis.aggregate import (
    AVERAGE,
    COPY16,
    COPY16_AVERAGE,
    best_of_grid,
    derived_meta,
    grid_summary,
    length_param,
    load_sweep,
    mad_scores,
    run_rows,
    selected_metrics,
    varying_task_params,
)
from mixlab.analysis.claims import VERDICT_RULE
from mixlab.analysis.plots import length_frame
from mixlab.analysis.report import write_report
from mixlab.analysis.tables import (
    REFERENCE,
    MadEntry,
    grid_table,
    mad_budget_table,
    mad_entry,
    mad_solved_table,
    mad_table,
    mad_text,
)
from mixlab.tasks.mad import mad_sweep_settings

SETTINGS = {(s.task, s.label): s for s in mad_sweep_settings()}
MAD_TASKS = ["mad/compression", "mad/fuzzy_recall", "mad/in_context_recall", "mad/memorization",
             "mad/noisy_recall", "mad/selective_copy"]


def record(name, task, params, num_train, history, *, lr=1e-3, wd=0.0, seed=0, model=None):
    """A hand-made run record: ``history`` is a list of (test perplexity, accuracy) per epoch."""
    entries = [{"epoch": i + 1, "step": 10 * (i + 1), "test_ppl": ppl, "test_loss": math.log(ppl),
                "acc_macro": acc, "acc_micro": acc} for i, (ppl, acc) in enumerate(history)]
    best = min(entries, key=lambda h: h["test_ppl"])
    model = model or {"mixer": "attention", "qkv_conv": "none", "d_model": 128}
    train = {"lr": lr, "weight_decay": wd, "init_seed": seed, "data_seed": seed, "num_train": num_train}
    return {"name": name, "config": {"task": task, "task_params": params, "model": model, "train": train},
            "history": entries, "final": {**best, "best_epoch": best["epoch"], "best_step": best["step"]},
            "steps": entries[-1]["step"], "n_params": 1000}


def mad_record(task, label, history, **kwargs):
    setting = SETTINGS[(task, label)]
    name = f"{task.split('/')[1]}-{label}-{kwargs.get('lr', 1e-3)}-{kwargs.get('seed', 0)}"
    return record(name, task, setting.params, setting.num_train, history, **kwargs)


def write_sweep(folder, records, manifest=None):
    (folder / "runs").mkdir(parents=True)
    for rec in records:
        (folder / "runs" / f"{rec['name']}.json").write_text(json.dumps(rec))
    if manifest is not None:
        (folder / "sweep.json").write_text(json.dumps(manifest))
    return folder


def cells(markdown, first):
    """The stripped cells of the markdown table row whose first cell is ``first``."""
    for line in markdown.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and parts[0] == first:
            return parts
    raise AssertionError(f"no row {first!r}")


def manifest_for(records, metas, kind, spec):
    runs = [{"hash": r["name"], "config": r["config"], "meta": m} for r, m in zip(records, metas)]
    return {"format": 1, "name": spec.get("name", "fixture"), "kind": kind, "spec": spec, "runs": runs}


@pytest.fixture
def mad_dir(tmp_path):
    """A transformer MAD folder: six baselines x lr {1e-4, 1e-3} x seeds 0-2; the score of task i, seed s at
    the better lr (1e-3) is 0.1 * (i + 1) + 0.01 * s, the worse lr scores 0.05 less."""
    records, metas = [], []
    for i, task in enumerate(MAD_TASKS):
        for seed in range(3):
            for lr, penalty in [(1e-4, 0.05), (1e-3, 0.0)]:
                acc = 0.1 * (i + 1) + 0.01 * seed - penalty
                records.append(mad_record(task, "baseline", [(2.0, acc / 2), (1.5, acc)], lr=lr, seed=seed))
                metas.append({"task": task, "setting": "baseline", "model": "transformer", "model_grid": {},
                              "train_grid": {"lr": lr, "weight_decay": 0.0}, "seed": seed})
    spec = {"protocol": "mad", "model": "transformer", "model_fields": models.PRESETS["transformer"],
            "profile": {"name": "paper"}, "profile_text": "profile paper: the full protocol",
            "seeds": [0, 1, 2], "metric": "acc_macro"}
    return write_sweep(tmp_path / "mad", records, manifest_for(records, metas, "mad", spec))


@pytest.fixture
def grid_dir(tmp_path):
    """A width sweep: two models x d_model {32, 64} x lr {1e-3, 1e-2} x seeds 0-2 on varlen MQAR."""
    records, metas = [], []
    for model, conv in [("no_conv", "none"), ("dynamic_conv", "dynamic_lowrank")]:
        for d in (32, 64):
            for lr in (1e-3, 1e-2):
                for seed in range(3):
                    acc = (0.3 if conv == "none" else 0.6) + d / 1000 + (lr == 1e-2) * 0.1 + 0.01 * seed
                    fields = {"mixer": "attention", "qkv_conv": conv, "d_model": d}
                    records.append(record(f"{model}-{d}-{lr}-{seed}", "mqar_varlen", {"vocab_size": 64}, 1000,
                                          [(3.0, acc)], lr=lr, seed=seed, model=fields))
                    metas.append({"task": "mqar_varlen", "setting": "default", "model": model,
                                  "model_grid": {"d_model": d}, "train_grid": {"lr": lr}, "seed": seed})
    spec = {"name": "widths", "description": "fixture width sweep", "metric": "acc_micro", "seeds": [0, 1, 2]}
    return write_sweep(tmp_path / "widths", records, manifest_for(records, metas, "grid", spec))


def length_sweep(folder, points, widths=(32, 64)):
    """A length sweep on MQAR: models a and b x d_model ``widths`` x (seq_len, num_kv_pairs) ``points`` x lr
    {1e-3, 1e-2} x seeds 0-2. At the better lr (1e-2) model a scores 0.9 - seq_len / 1000 - pairs / 100 + d / 1000
    + 0.01 * seed, model b 0.3 less; the worse lr 0.2 less."""
    records, metas = [], []
    for model, base in [("a", 0.9), ("b", 0.6)]:
        for d in widths:
            for seq_len, pairs in points:
                for lr in (1e-3, 1e-2):
                    for seed in range(3):
                        acc = base - seq_len / 1000 - pairs / 100 + d / 1000 - (lr == 1e-3) * 0.2 + 0.01 * seed
                        params = {"vocab_size": 64, "seq_len": seq_len, "num_kv_pairs": pairs}
                        records.append(record(f"{model}-{d}-{seq_len}-{pairs}-{lr}-{seed}", "mqar", params, 1000,
                                              [(3.0, acc)], lr=lr, seed=seed, model={"mixer": model, "d_model": d}))
                        metas.append({"task": "mqar", "setting": f"seq_len={seq_len} num_kv_pairs={pairs}",
                                      "model": model, "model_grid": {"d_model": d}, "train_grid": {"lr": lr},
                                      "seed": seed})
    spec = {"name": "lengths", "description": "fixture length sweep", "metric": "acc_micro", "seeds": [0, 1, 2]}
    return write_sweep(folder, records, manifest_for(records, metas, "grid", spec))


def length_best(folder):
    rows = load_sweep(folder).rows
    return rows, best_of_grid(rows, ("task", "setting", "model", "d_model", "seed"), "acc_micro")


def test_selected_metrics_are_the_lowest_perplexity_epoch():
    rec = record("r", "mqar", {}, 10, [(3.0, 0.9), (2.0, 0.6), (2.0, 0.7), (2.5, 0.95)])
    chosen = selected_metrics(rec)
    assert (chosen["epoch"], chosen["acc_macro"]) == (2, 0.6), "lowest perplexity, first on ties"
    assert selected_metrics({**rec, "history": []})["acc_macro"] == 0.6, "no history: the record's final"


def test_at_end_marks_runs_still_improving_when_training_ended():
    falling = record("falling", "mqar", {}, 10, [(3.0, 0.5), (2.0, 0.6)])
    turned = record("turned", "mqar", {}, 10, [(2.0, 0.6), (2.5, 0.7)])
    stopped = {**record("stopped", "mqar", {}, 10, [(3.0, 0.5), (2.0, 1.0)]), "stopped_early": True}
    bare = {**record("bare", "mqar", {}, 10, [(2.0, 0.6)]), "history": []}
    assert [r["at_end"] for r in run_rows([falling, turned, stopped, bare])] == [True, False, False, False]


def test_mad_budget_table_counts_scored_runs_at_end(mad_dir):
    entry = mad_entry(load_sweep(mad_dir))  # every fixture run's perplexity falls to its last epoch
    table = mad_budget_table([entry]).markdown()
    assert cells(table, "Memorize") == ["Memorize", "3/3"] and "Average" not in table
    early = [{**row, "at_end": row["seed"] != 0} for row in entry.scores.per_setting]
    entry.scores.per_setting[:] = early
    assert cells(mad_budget_table([entry]).markdown(), "Compress") == ["Compress", "2/3"]


def test_mad_scoring_by_hand():
    icr, mem = "mad/in_context_recall", "mad/memorization"
    records = [
        # ICR baseline: seed 0 best 0.7 (lr 1e-2); seed 1 best 0.6 (lr 1e-3).
        mad_record(icr, "baseline", [(1.0, 0.5), (1.5, 0.99)], lr=1e-3, seed=0),  # 0.99 is not the lowest ppl
        mad_record(icr, "baseline", [(1.2, 0.7)], lr=1e-2, seed=0),
        mad_record(icr, "baseline", [(1.0, 0.6)], lr=1e-3, seed=1),
        mad_record(icr, "baseline", [(1.0, 0.4)], lr=1e-2, seed=1),
        # ICR vocab_size=32: seed 0 best 0.9; seed 1 best 0.3.
        mad_record(icr, "vocab_size=32", [(1.0, 0.9)], lr=1e-3, seed=0),
        mad_record(icr, "vocab_size=32", [(1.0, 0.1)], lr=1e-2, seed=0),
        mad_record(icr, "vocab_size=32", [(1.0, 0.2)], lr=1e-3, seed=1),
        mad_record(icr, "vocab_size=32", [(1.0, 0.3)], lr=1e-2, seed=1),
        # Memorization baseline: seed 0 best 0.8; seed 1 best 0.5.
        mad_record(mem, "baseline", [(1.0, 0.8)], lr=1e-3, seed=0),
        mad_record(mem, "baseline", [(1.0, 0.2)], lr=1e-2, seed=0),
        mad_record(mem, "baseline", [(1.0, 0.4)], lr=1e-3, seed=1),
        mad_record(mem, "baseline", [(1.0, 0.5)], lr=1e-2, seed=1),
    ]
    scores = mad_scores(run_rows(records))
    best = {(r["task"], r["setting"], r["seed"]): (r["acc_macro"], r["lr"]) for r in scores.per_setting}
    assert best[(icr, "baseline", 0)] == (0.7, 1e-2) and best[(icr, "baseline", 1)] == (0.6, 1e-3)
    assert best[(icr, "vocab_size=32", 1)] == (0.3, 1e-2) and len(best) == 6
    assert scores.per_seed["In-Context Recall"] == pytest.approx({0: 0.8, 1: 0.45})  # mean over settings
    assert scores.per_seed["Memorize"] == pytest.approx({0: 0.8, 1: 0.5})
    assert scores.per_seed[AVERAGE] == pytest.approx({0: 0.8, 1: 0.475})  # mean over tasks, not runs
    icr_stats = scores.summary["In-Context Recall"]
    stats = (icr_stats.median, icr_stats.q25, icr_stats.q75, icr_stats.n)
    assert stats == pytest.approx((0.625, 0.5375, 0.7125, 2))


def test_selective_copy_as_mad_lab_scored_it_before_the_copy_fix():
    """The 16-copied variant: the num_tokens_to_copy settings take the baseline's score; other settings keep
    theirs; a seed without the baseline gets no variant score."""
    copy = "mad/selective_copy"
    scores = {"baseline": 0.9, "vocab_size=32": 0.5, "num_tokens_to_copy=32": 0.1, "num_tokens_to_copy=96": 0.3}
    records = [mad_record(copy, setting, [(1.0, acc)], lr=1e-3, seed=0) for setting, acc in scores.items()]
    records.append(mad_record(copy, "vocab_size=32", [(1.0, 0.4)], lr=1e-3, seed=1))
    result = mad_scores(run_rows(records))
    assert result.per_seed["Selective Copy"] == pytest.approx({0: 0.45, 1: 0.4})
    assert result.copy16 == pytest.approx({0: (0.9 + 0.5 + 0.9 + 0.9) / 4})
    assert COPY16 not in result.per_seed and result.per_seed[AVERAGE] == pytest.approx({0: 0.45, 1: 0.4})


def test_solved_table_lists_the_settings_that_split_between_seeds():
    icr, mem = "mad/in_context_recall", "mad/memorization"
    accs = {(icr, "baseline"): [0.995, 0.3, 0.991], (icr, "vocab_size=32"): [1.0, 1.0, 1.0],
            (mem, "baseline"): [0.5] * 3}
    records = [mad_record(task, setting, [(1.0, acc)], lr=1e-3, seed=seed)
               for (task, setting), values in accs.items() for seed, acc in enumerate(values)]
    entry = MadEntry(label="m", scores=mad_scores(run_rows(records)), reference=None, profile="p", profile_text="",
                     missing=0)
    table = mad_solved_table([entry])
    assert table is not None and table.rows == [["In-Context Recall", "baseline", "2/3"]]
    assert mad_solved_table([entry], level=0.2) is None  # every seed of every setting solves at 0.2


AVERAGE_OF_SIX = """
from mixlab.analysis.aggregate import mad_scores
tasks = {tasks!r}
values = [0.1, 0.7, 0.2, 0.3000000000000001, 0.9, 0.11]  # their float sum depends on the order
rows = [{{"hash": str(i), "task": t, "setting": "baseline", "seed": 0, "acc_macro": v}}
        for i, (t, v) in enumerate(zip(tasks, values))]
print(repr(mad_scores(rows).per_seed["Average"][0]))
"""


def test_mad_average_does_not_depend_on_string_hashing():
    # the mean over tasks once iterated a set of task names: its last bits changed from process to process
    # the six interpreters start at once: each spends seconds importing torch, and they overlap on the cores
    code = AVERAGE_OF_SIX.format(tasks=MAD_TASKS)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}) for seed in range(6)]
    outputs = {proc.communicate()[0] for proc in procs}
    assert [proc.returncode for proc in procs] == [0] * 6
    assert outputs == {"0.385\n"}


def test_best_of_grid_ignores_nan_and_keeps_the_first_tie():
    rows = [{"g": 1, "lr": 1, "m": math.nan}, {"g": 1, "lr": 2, "m": 0.5}, {"g": 1, "lr": 3, "m": 0.5}]
    assert best_of_grid(rows, ("g",), "m") == [{"g": 1, "lr": 2, "m": 0.5}]


def test_mad_table_beside_the_reference(mad_dir):
    entry = mad_entry(load_sweep(mad_dir))
    assert entry.reference == REFERENCE["transformer"] and entry.label == "transformer (paper, n=3)"
    assert entry.scores.summary["Compress"].median == pytest.approx(0.11)  # task 0, seeds 0.10 / 0.11 / 0.12
    assert entry.scores.summary[AVERAGE].median == pytest.approx(0.36)  # mean of 0.1..0.6, plus seed 1's 0.01
    assert entry.scores.summary[AVERAGE].iqr == pytest.approx(0.01)
    table = mad_table([entry]).markdown()
    assert cells(table, "Task") == ["Task", "transformer (paper, n=3)", "ref", "diff"]
    assert cells(table, "Compress") == ["Compress", "0.110 [0.010]", "0.375", "-0.265"]
    assert cells(table, "Average") == ["Average", "0.360 [0.010]", "0.709", "-0.349"]
    assert "warning" not in mad_text([entry])


def test_missing_runs_are_reported(mad_dir):
    next((mad_dir / "runs").glob("*.json")).unlink()
    text = mad_text([mad_entry(load_sweep(mad_dir))])
    assert "warning: 1 planned runs have no record yet" in text


def test_a_task_is_scored_only_for_seeds_with_all_its_runs(mad_dir):
    manifest = json.loads((mad_dir / "sweep.json").read_text())
    # memorization (task 3), seed 0, lr 1e-3: its best run; seeds 1 and 2 stay complete
    gone = next(r for r in manifest["runs"] if r["meta"]["task"] == "mad/memorization"
                and r["meta"]["seed"] == 0 and r["meta"]["train_grid"]["lr"] == 1e-3)
    (mad_dir / "runs" / f"{gone['hash']}.json").unlink()
    entry = mad_entry(load_sweep(mad_dir))
    assert entry.scores.per_seed["Memorize"] == pytest.approx({1: 0.41, 2: 0.42})  # not seed 0's worse lr
    assert entry.scores.coverage == {"Memorize": (5, 6)}
    assert sorted(entry.scores.per_seed[AVERAGE]) == [1, 2]
    table = mad_table([entry]).markdown()
    # two seeds here, three in the other tasks: the column's header gives no count, each cell its own
    assert cells(table, "Memorize")[1] == "0.415 [0.005], n=2 (partial 5/6)"
    assert cells(table, "Compress")[1] == "0.110 [0.010], n=3"
    # a task with no complete seed has no score, and no seed has an average
    for run in manifest["runs"]:
        if run["meta"]["task"] == "mad/compression" and run["meta"]["train_grid"]["lr"] == 1e-3:
            (mad_dir / "runs" / f"{run['hash']}.json").unlink(missing_ok=True)
    table = mad_table([mad_entry(load_sweep(mad_dir))]).markdown()
    assert cells(table, "Compress")[1] == "partial 3/6"
    assert cells(table, "Average")[1] == "— (tasks partial)"


def test_a_mad_folder_with_no_task_complete_reports_without_a_figure(mad_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mad_tasks.png").write_bytes(b"an older figure")
    manifest = json.loads((mad_dir / "sweep.json").read_text())
    for run in manifest["runs"]:  # every task and seed loses a run (seed 0 its lr 1e-3, the others 1e-4)
        if (run["meta"]["seed"] == 0) == (run["meta"]["train_grid"]["lr"] == 1e-3):
            (mad_dir / "runs" / f"{run['hash']}.json").unlink()
    written = {p.name for p in write_report([mad_dir], out)}
    assert written == {"report.md", "mad_tasks.csv", "mad_epochs.csv", "mad_settings.csv", "mad_curves.png"}
    assert not (out / "mad_tasks.png").exists()
    report = (out / "report.md").read_text()
    assert "nothing to draw" in report and "mad_tasks.png" not in report
    assert cells(mad_table([mad_entry(load_sweep(mad_dir))]).markdown(), "Compress")[1] == "partial 3/6"


def test_model_without_reference_has_empty_reference_columns(mad_dir):
    manifest = json.loads((mad_dir / "sweep.json").read_text())
    manifest["spec"].update(model="rubiconv", model_fields={"mixer": "rubiconv"})
    (mad_dir / "sweep.json").write_text(json.dumps(manifest))
    table = mad_table([mad_entry(load_sweep(mad_dir))]).markdown()
    assert cells(table, "Compress") == ["Compress", "0.110 [0.010]", "—", "—"]


def test_labels_derived_without_a_manifest(tmp_path):
    rec = mad_record("mad/in_context_recall", "seq_len=256", [(1.0, 0.5)], seed=4,
                     model={"mixer": "attention", "qkv_conv": "static", "d_model": 64})
    other = record("m", "mqar", {"vocab_size": 32, "seq_len": 64, "num_kv_pairs": 8, "power_a": 0.01}, 100,
                   [(1.0, 0.5)])
    meta = derived_meta(rec["config"])
    assert (meta["setting"], meta["model"], meta["seed"]) == ("seq_len=256", "attention+qkv_static", 4)
    assert meta["model_grid"] == {"d_model": 64} and meta["train_grid"] == {"lr": 1e-3, "weight_decay": 0.0}
    assert derived_meta(other["config"])["setting"] == "vocab_size=32"
    data = load_sweep(write_sweep(tmp_path / "bare", [rec]))
    assert data.kind == "mad" and data.label == "bare" and data.missing == 0


def test_partial_files_are_not_records(tmp_path):
    folder = write_sweep(tmp_path / "s", [record("good", "mqar", {}, 10, [(1.0, 0.5)])])
    (folder / "runs" / ".good2.json.abc123.tmp").write_text('{"name": "good2"')  # a run in flight: not looked at
    (folder / "runs" / "cut.json").write_text('{"config": {"task": "mqar"}, "fin')
    data = load_sweep(folder)
    assert [r["name"] for r in data.records] == ["good"]
    assert [(u.path.name, u.reason.split(" (")[0]) for u in data.unreadable] == [("cut.json", "not valid JSON")]
    with pytest.raises(ValueError, match="no run records"):
        load_sweep(write_sweep(tmp_path / "empty", []))


def test_grid_summary_takes_the_best_lr_per_seed(grid_dir):
    summary = {(r["model"], r["model_grid"]): r for r in grid_summary(load_sweep(grid_dir))}
    row = summary[("dynamic_conv", "d_model=64")]
    assert row["median"] == pytest.approx(0.6 + 0.064 + 0.1 + 0.01) and row["n"] == 3
    assert row["iqr"] == pytest.approx(0.01) and row["best_train"] == "lr=0.01"


def test_report_renders_from_fixture_dirs(mad_dir, grid_dir, tmp_path):
    out = tmp_path / "report"
    written = write_report([mad_dir, grid_dir], out)
    names = {p.name for p in written}
    assert names == {"report.md", "mad_tasks.csv", "mad_epochs.csv", "mad_settings.csv", "mad_tasks.png",
                     "mad_curves.png", "widths_summary.csv", "widths_acc_vs_width.png", "widths_curves.png"}
    for png in ("mad_tasks.png", "widths_acc_vs_width.png", "mad_curves.png", "widths_curves.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    report = (out / "report.md").read_text()
    assert "## MAD" in report and "## widths" in report and "(mad_tasks.png)" in report
    assert "(mad_curves.png)" in report and "(widths_curves.png)" in report
    assert "### Runs still improving when their budget ended" in report
    assert cells(report, "Memorize")[:3] == ["Memorize", "0.410 [0.010]", "0.791"]  # task 3: 0.4 + seed 1
    with (out / "mad_tasks.csv").open() as f:
        tasks_csv = list(csv.DictReader(f))
    assert len(tasks_csv) == 9 and float(tasks_csv[0]["reference"]) == 0.375
    assert [r["task"] for r in tasks_csv[5:]] == ["Selective Copy", COPY16, "Average", COPY16_AVERAGE]
    assert float(tasks_csv[8]["reference"]) == REFERENCE["transformer"]["Average"]
    with (out / "widths_summary.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4
    # the same records give the same files, figures included (no jitter from a global RNG)
    before = {p.name: p.read_bytes() for p in written}
    assert {p.name: p.read_bytes() for p in write_report([mad_dir, grid_dir], out)} == before


def test_report_of_one_folder_goes_into_it_and_several_need_out(grid_dir, mad_dir):
    written = write_report([grid_dir])
    assert all(p.parent == grid_dir for p in written)
    with pytest.raises(ValueError, match="--out"):
        write_report([grid_dir, mad_dir])


def test_report_of_a_collection_folder_covers_its_sweeps_in_reference_order(mad_dir, tmp_path):
    collection = tmp_path / "collection"
    shutil.copytree(mad_dir, collection / "b-transformer")
    static = shutil.copytree(mad_dir, collection / "a-static")  # sorts first by name
    manifest = json.loads((static / "sweep.json").read_text())
    manifest["spec"].update(model="static_conv_qkv", model_fields=models.PRESETS["static_conv_qkv"])
    (static / "sweep.json").write_text(json.dumps(manifest))
    written = write_report([collection])
    assert all(p.parent == collection for p in written)
    header = cells((collection / "report.md").read_text(), "Task")
    assert header[1].startswith("transformer") and header[4].startswith("static_conv_qkv")


def test_two_folders_of_one_model_and_profile_get_their_folders_as_column_labels(mad_dir, tmp_path):
    collection = tmp_path / "collection"
    shutil.copytree(mad_dir, collection / "transformer-paper")
    v2 = shutil.copytree(mad_dir, collection / "transformer-paper-v2")
    manifest = json.loads((v2 / "sweep.json").read_text())
    # seed 0 only: the columns' seed counts differ, the model names alone would not tell them apart
    manifest["spec"]["seeds"] = [0]
    for run in [r for r in manifest["runs"] if r["meta"]["seed"] != 0]:
        manifest["runs"].remove(run)
        (v2 / "runs" / f"{run['hash']}.json").unlink()
    (v2 / "sweep.json").write_text(json.dumps(manifest))
    write_report([collection])
    header = cells((collection / "report.md").read_text(), "Task")
    assert sorted(header[1::3]) == ["transformer-paper (paper, n=3)", "transformer-paper-v2 (paper, n=1)"]


def test_two_folders_of_one_grid_sweep_get_their_folders_as_names(grid_dir, tmp_path):
    collection = tmp_path / "collection"
    shutil.copytree(grid_dir, collection / "widths")
    gpu = shutil.copytree(grid_dir, collection / "widths_gpu")
    (gpu / "runs" / sorted(p.name for p in (gpu / "runs").glob("*.json"))[0]).unlink()
    written = {p.name for p in write_report([collection])}
    assert {"widths_summary.csv", "widths_gpu_summary.csv", "widths_acc_vs_width.png",
            "widths_gpu_acc_vs_width.png"} <= written
    report = (collection / "report.md").read_text()
    assert "## widths\n" in report and "## widths_gpu\n" in report and "1 planned runs have no record" in report


def test_grid_table_shows_score_groups_and_the_papers_values(grid_dir):
    for path in (grid_dir / "runs").glob("*.json"):
        rec = json.loads(path.read_text())
        for entry in rec["history"]:
            entry.update(acc_present=entry["acc_micro"] - 0.1, acc_absent=1.0)
        rec["stopped_early"] = rec["name"] == "dynamic_conv-64-0.01-0"  # the others end on their best epoch
        path.write_text(json.dumps(rec))
    manifest = json.loads((grid_dir / "sweep.json").read_text())
    manifest["spec"]["reference"] = {"source": "a paper", "claims": ["dynamic wins"], "values": [
        {"task": "mqar_varlen", "model": "dynamic_conv", "value": 0.9, "note": ""},
        {"task": "mqar_varlen", "model": "no_conv", "note": "< 50%"}]}
    (grid_dir / "sweep.json").write_text(json.dumps(manifest))
    table, summary = grid_table(load_sweep(grid_dir))
    text = table.markdown()
    assert table.headers[-6:] == ["acc_absent median", "acc_present median", "best training", "still improving",
                                  "paper", "diff"]
    # dynamic_conv, d=64: best lr 1e-2 scores 0.6 + 0.064 + 0.1 + 0.01 * seed; median over seeds 0.774
    row = next(line for line in text.splitlines() if "dynamic_conv" in line and "d_model=64" in line)
    parts = [c.strip() for c in row.strip("|").split("|")]
    assert parts[6:] == ["1.000", "0.674", "lr=0.01", "2/3", "0.900", "-0.126"]
    row = next(line for line in text.splitlines() if "no_conv" in line and "d_model=32" in line)
    assert [c.strip() for c in row.strip("|").split("|")][-2:] == ["< 50%", "—"]
    assert "Paper: a paper" in write_report([grid_dir])[0].read_text()
    # one width left: bars of the metric and the score groups instead of the width plot
    for path in (grid_dir / "runs").glob("*-64-*.json"):
        path.unlink()
    written = {p.name: p for p in write_report([grid_dir])}
    assert "widths_bars.png" in written and "widths_acc_vs_width.png" not in written
    assert written["widths_bars.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(widths_bars.png)" in written["report.md"].read_text()



@pytest.mark.parametrize("points, varying, param, panel, tick, xlabel", [
    # Zoology's layout: the pairs scale with the length, so they label the ticks
    ([(32, 4), (64, 8), (128, 16)], ["seq_len", "num_kv_pairs"], "seq_len", "mqar d_model=64", "64/8",
     "seq_len/num_kv_pairs"),
    # pairs crossed with the lengths split the panels, so that a line varies the length alone
    ([(32, 4), (64, 4), (32, 8), (64, 8)], ["seq_len", "num_kv_pairs"], "seq_len", "mqar d_model=64 num_kv_pairs=8",
     "64", "seq_len"),
    ([(64, 4), (64, 8)], ["num_kv_pairs"], "num_kv_pairs", "mqar d_model=64", "8", "num_kv_pairs"),
], ids=["pairs-scaled", "pairs-crossed", "pairs-only"])
def test_length_frame_holds_the_best_lr_per_seed_against_the_varying_length(tmp_path, points, varying, param, panel,
                                                                           tick, xlabel):
    rows, best = length_best(length_sweep(tmp_path / "lengths", points))
    assert varying_task_params(rows) == varying and length_param(rows) == param
    frame, label = length_frame(best, param, "acc_micro")
    assert label == xlabel and len(frame) == 2 * 2 * len(points) * 3  # models x widths x points x seeds
    panels = list(dict.fromkeys(frame["panel"]))
    assert panel in panels and len(panels) == (4 if "num_kv_pairs=" in panel else 2)
    assert panels[0].startswith("mqar d_model=32")  # panels by width, narrowest first
    # model b, d_model 64, seq_len 64 with 8 pairs, lr 1e-2: 0.6 - 0.064 - 0.08 + 0.064 + 0.01 * seed
    point = frame[(frame["model"] == "b") & (frame["panel"] == panel) & (frame[param] == (8 if "pairs" in param
                                                                                        else 64))]
    assert sorted(point["acc_micro"]) == pytest.approx([0.52, 0.53, 0.54]) and sorted(point["seed"]) == [0, 1, 2]
    assert set(point["tick"]) == {tick} and list(frame["model"].cat.categories) == ["a", "b"]


def test_no_length_figure_without_a_varying_length(grid_dir):
    rows = load_sweep(grid_dir).rows
    assert varying_task_params(rows) == [] and length_param(rows) is None
    with pytest.raises(ValueError, match="'seq_len'"):
        length_frame(rows, "seq_len", "acc_micro")


@pytest.mark.parametrize("widths, width_figure", [((32, 64), "lengths_acc_vs_width.png"), ((32,), "lengths_bars.png")],
                         ids=["widths", "one-width"])
def test_report_draws_accuracy_against_length_beside_the_width_figure(tmp_path, widths, width_figure):
    folder = length_sweep(tmp_path / "lengths", [(32, 4), (64, 8)], widths)
    written = {p.name: p for p in write_report([folder])}
    assert set(written) == {"report.md", "lengths_summary.csv", width_figure, "lengths_acc_vs_length.png",
                            "lengths_curves.png"}
    data = written["lengths_acc_vs_length.png"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    report = written["report.md"].read_text()
    assert f"({width_figure})\n\n![lengths: accuracy against seq_len](lengths_acc_vs_length.png)" in report


@pytest.fixture
def drawn(monkeypatch):
    """The figures the report draws, kept (``plots._save`` closes them; their axes stay readable)."""
    figures = {}
    save = plots._save

    def keep(fig, path):
        figures[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def test_grid_curves_are_the_median_and_iqr_over_seeds_of_each_cells_best_point(grid_dir, tmp_path, drawn):
    """Per cell (one panel per width) each model's line is the median over its three seeds of the best lr's runs
    at each evaluation, with the IQR band; the loss below it on a log axis."""
    data = load_sweep(grid_dir)
    with (grid_dir / "runs" / "dynamic_conv-64-0.01-1.json").open() as f:
        assert json.load(f)["history"][0]["acc_micro"] == pytest.approx(0.6 + 0.064 + 0.1 + 0.01)
    write_report([grid_dir], tmp_path / "out")
    fig = drawn["widths_curves.png"]
    top, bottom = fig.axes[1], fig.axes[3]  # the d_model=64 panel: accuracy above, loss below
    assert top.get_title() == "mqar_varlen d_model=64" and bottom.get_yscale() == "log"
    (no_conv, dynamic) = [line.get_ydata() for line in top.get_lines()]
    assert list(no_conv) == pytest.approx([0.3 + 0.064 + 0.1 + 0.01]), "the median of the best lr's seeds"
    assert list(dynamic) == pytest.approx([0.6 + 0.064 + 0.1 + 0.01])
    assert len(top.collections) == 2, "an IQR band per model"
    assert data.metric == "acc_micro" and top.get_ylabel() == "acc_micro"


def test_single_runs_get_a_curve_each(tmp_path, drawn):
    folder = tmp_path / "runs"
    folder.mkdir()
    for i, accs in enumerate([(0.2, 0.4, 0.6), (0.1, 0.3, 0.5), (0.5, 0.5, 0.9)]):
        rec = record(f"run{i}", "mqar", {"seq_len": 32}, 100, [(3.0 - a, a) for a in accs])
        (folder / f"run{i}.json").write_text(json.dumps(rec))
    written = write_report([folder], tmp_path / "out")
    assert "runs_curves.png" in {p.name for p in written}
    top = drawn["runs_curves.png"].axes[0]
    assert [list(line.get_ydata()) for line in top.get_lines()] == [[0.2, 0.4, 0.6], [0.1, 0.3, 0.5],
                                                                     [0.5, 0.5, 0.9]]
    assert [list(line.get_xdata()) for line in top.get_lines()][0] == [10, 20, 30]
    assert "(runs_curves.png)" in (tmp_path / "out" / "report.md").read_text()


def test_a_smoke_profile_judges_no_claims(mad_dir, tmp_path):
    """The paper's claims are judged on a real profile; on the smoke profile (a few dozen steps) the report says
    they are not judged, with no verdicts."""
    paper = write_report([mad_dir], tmp_path / "paper")[0].read_text()
    assert "### The paper's claims, paper profile" in paper and VERDICT_RULE in paper
    manifest = json.loads((mad_dir / "sweep.json").read_text())
    manifest["spec"]["profile"]["name"] = "smoke"
    (mad_dir / "sweep.json").write_text(json.dumps(manifest))
    smoke = write_report([mad_dir], tmp_path / "smoke")[0].read_text()
    assert "### The paper's claims, smoke profile\n\nNot judged: the smoke profile checks" in smoke
    assert VERDICT_RULE not in smoke


def test_a_cell_whose_seeds_split_gives_the_share_solved_beside_its_median(grid_dir):
    """dynamic_conv at d=64 solves (>= 0.99) on seed 1 only: the median 0.784 would hide it; a cell whose seeds
    all fall short (or all solve) gets no share."""
    for path in (grid_dir / "runs").glob("dynamic_conv-64-0.01-1.json"):
        rec = json.loads(path.read_text())
        rec["history"][-1]["acc_micro"] = 0.995
        path.write_text(json.dumps(rec))
    table, summary = grid_table(load_sweep(grid_dir))
    cells = {(r[2], r[3]): r[4] for r in table.rows}
    assert cells["dynamic_conv", "d_model=64"] == "0.784 [0.116], 1/3 solved"
    assert cells["dynamic_conv", "d_model=32"] == "0.742 [0.010]"
    assert [r["solved"] for r in summary if r["model"] == "dynamic_conv"] == [0, 1]
