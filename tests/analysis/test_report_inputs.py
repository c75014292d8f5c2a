"""What `mixlab report` reads: unreadable records named and their cells partial, paths that do not exist refused,
the records of single runs (`mixlab run --out`) tabulated beside sweeps."""

import csv
import json
import shutil

import pytest
from mixlab.analysis.aggregate import load_sweep
from mixlab.analysis.report import write_report
from mixlab.analysis.tables import grid_table, mad_entry, mad_setting_table, mad_table
from mixlab.runners.cli.main import main
from test_aggregate import cells, grid_dir, mad_dir  # noqa: F401  (fixtures)

# a run of a few seconds on the CPU (the tiny MQAR of tests/runners/test_cli.py)
TINY_RUN = ["--set", "seq_len=32", "--set", "num_kv_pairs=4", "--set", "vocab_size=64", "--set", "d_model=16",
            "--set", "n_heads=2", "--set", "n_layers=1", "--set", "num_train=16", "--set", "num_test=8",
            "--set", "batch_size=8", "--steps", "3", "--device", "cpu", "--no-progress"]


def report_cli(capsys, *argv):
    """`mixlab report ARGV` in-process: (exit status, stdout, stderr)."""
    try:
        main(["report", *map(str, argv)])
    except SystemExit as exc:
        return exc.code, *capsys.readouterr()
    return 0, *capsys.readouterr()


def table_row(markdown, *firsts):
    """The stripped cells of the markdown table row whose first cells are ``firsts``."""
    for line in markdown.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and parts[: len(firsts)] == list(firsts):
            return parts
    raise AssertionError(f"no row {firsts!r}")


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    """Two records written by `mixlab run --out`: static_conv and attention on the tiny MQAR."""
    folder = tmp_path_factory.mktemp("single") / "runs"
    for mixer in ("static_conv", "attention"):
        main(["run", "mqar", "--mixer", mixer, *TINY_RUN, "--out", str(folder)])
    return folder


# ---- unreadable records: named with their reason, their cells partial, how to retrain them


def test_an_unreadable_grid_record_is_named_and_its_cell_partial(grid_dir, tmp_path):  # noqa: F811
    # dynamic_conv, d_model=64, seed 0: lr 1e-2 is its best point; cut, its seed would silently take lr 1e-3
    bad = grid_dir / "runs" / "dynamic_conv-64-0.01-0.json"
    bad.write_text(bad.read_text()[:200])
    # no_conv, d_model=32: every run of the cell unreadable, one of them a JSON object that is no record
    for path in grid_dir.glob("runs/no_conv-32-*.json"):
        path.write_text("")
    (grid_dir / "runs" / "no_conv-32-0.001-0.json").write_text('{"config": {"task": "mqar_varlen"}, "final": {}}')
    data = load_sweep(grid_dir)
    assert len(data.records) == 24 - 7
    reasons = {u.path.name: u.reason for u in data.unreadable}
    assert reasons["dynamic_conv-64-0.01-0.json"].startswith("not valid JSON (")
    assert reasons["no_conv-32-0.01-1.json"] == "empty file"
    assert reasons["no_conv-32-0.001-0.json"] == "not a run record (no 'train')"

    text = grid_table(data)[0].markdown()
    assert table_row(text, "mqar_varlen", "default", "dynamic_conv", "d_model=64")[4:6] == [
        "0.774 [0.060] (partial 5/6)", "3"]
    assert table_row(text, "mqar_varlen", "default", "no_conv", "d_model=32")[4:6] == ["partial 0/6", "0"]
    # the cells keep the manifest's order, the empty one included
    models = [line.split("|")[3].strip() + " " + line.split("|")[4].strip() for line in text.splitlines()[2:]]
    assert models == ["no_conv d_model=32", "no_conv d_model=64", "dynamic_conv d_model=32", "dynamic_conv d_model=64"]

    out = tmp_path / "report"
    written = {p.name: p for p in write_report([grid_dir], out)}
    report = written["report.md"].read_text()
    assert report.index("## Unreadable records") < report.index("## widths")
    assert (f"- `{bad}`: {reasons[bad.name]} (run: mqar_varlen, dynamic_conv, d_model=64, lr=0.01, seed 0)"
            in report)
    assert f"`mixlab sweep widths --seeds 3 --out {grid_dir}`" in report
    with written["widths_summary.csv"].open() as f:
        summary = {(r["model"], r["model_grid"]): r for r in csv.DictReader(f)}
    assert (summary[("dynamic_conv", "d_model=64")]["records"], summary[("dynamic_conv", "d_model=64")]["planned"]) \
        == ("5", "6")
    assert summary[("no_conv", "d_model=32")]["n"] == "0"


def test_the_command_line_names_each_unreadable_record_and_the_resuming_command(grid_dir, capsys):  # noqa: F811
    cut = grid_dir / "runs" / "no_conv-64-0.01-2.json"
    cut.write_text('{"config": {"task": "mqar_var')
    code, out, err = report_cli(capsys, grid_dir)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("wrote ")
    assert lines[1] == ("warning: 1 file where run records should be could not be read; the tables leave them out "
                        "and mark the cells of their runs partial:")
    assert lines[2].startswith(f"  `{cut}`: not valid JSON (") and lines[2].endswith(
        "(run: mqar_varlen, no_conv, d_model=64, lr=0.01, seed 2)")
    assert lines[3].startswith("To retrain them, delete these files and run again what wrote them")
    assert lines[4] == f"  `mixlab sweep widths --seeds 3 --out {grid_dir}`" and len(lines) == 5


def test_an_unreadable_mad_record_makes_its_task_and_setting_partial(mad_dir, tmp_path):  # noqa: F811
    manifest = json.loads((mad_dir / "sweep.json").read_text())
    run = next(r for r in manifest["runs"] if r["meta"]["task"] == "mad/memorization"
               and r["meta"]["seed"] == 0 and r["meta"]["train_grid"]["lr"] == 1e-3)
    (mad_dir / "runs" / f"{run['hash']}.json").write_text("{")
    entry = mad_entry(load_sweep(mad_dir))
    assert cells(mad_table([entry]).markdown(), "Memorize")[1] == "0.415 [0.005], n=2 (partial 5/6)"
    # seed 0's best of what is left is the worse lr (0.35); the median over seeds 0.41 is then partial
    settings = mad_setting_table([entry]).markdown()
    assert table_row(settings, "Memorize", "baseline")[2] == "0.410, n=3 (partial 5/6)"
    assert table_row(settings, "Compress", "baseline")[2] == "0.110, n=3"
    report = write_report([mad_dir], tmp_path / "report")[0].read_text()
    assert (f"- `{mad_dir / 'runs' / (run['hash'] + '.json')}`: not valid JSON (Expecting property name enclosed "
            "in double quotes: line 1 column 2 (char 1)) (run: mad/memorization, baseline, transformer, lr=0.001 "
            "weight_decay=0.0, seed 0)") in report
    assert f"- `mixlab mad run --model transformer --profile paper --seeds 3 --out {mad_dir}`" in report


def test_nothing_unreadable_adds_nothing(grid_dir, tmp_path):  # noqa: F811
    written = {p.name: p for p in write_report([grid_dir], tmp_path / "report")}
    assert "Unreadable" not in written["report.md"].read_text() and "partial" not in written["report.md"].read_text()
    with written["widths_summary.csv"].open() as f:
        assert "records" not in next(csv.reader(f))


def test_the_report_counts_records_by_device_and_versions(grid_dir, tmp_path):  # noqa: F811
    folder = grid_dir  # this test's own copy (the fixture writes into its tmp_path)
    records = sorted((folder / "runs").glob("*.json"))
    for n, path in enumerate(records[:5]):
        rec = json.loads(path.read_text())
        rec["device"] = {"name": "NVIDIA H200", "type": "cuda"}
        rec["versions"] = {"torch": "2.11.0", "triton": "3.6.0", "fla-core": "0.6.0"}
        if n < 2:
            rec["versions"]["fla-core chunk_bwd_dqkwg"] = "mixlab plain torch"
        path.write_text(json.dumps(rec))
    text = {p.name: p for p in write_report([folder], tmp_path / "report")}["report.md"].read_text()
    section = text[text.index("## Where the records trained"):]
    assert table_row(section, f"`{folder}`", "NVIDIA H200", "2.11.0", "3.6.0", "0.6.0", "mixlab plain torch")[-1] == "2"
    assert table_row(section, f"`{folder}`", "NVIDIA H200", "2.11.0", "3.6.0", "0.6.0", "-")[-1] == "3"
    assert table_row(section, f"`{folder}`", "not recorded", "-", "-", "-", "-")[-1] == str(len(records) - 5)


# ---- a path that does not exist: one line, exit 2, nothing created


def test_a_mistyped_folder_is_refused_and_nothing_is_created(capsys, tmp_path, grid_dir):  # noqa: F811
    typo = tmp_path / "widhts"
    code, out, err = report_cli(capsys, typo)
    assert (code, out, err) == (2, "", f"mixlab: error: no folder '{typo}'\n")
    assert not typo.exists()
    # among good folders, with --out: still nothing written
    code, _, err = report_cli(capsys, grid_dir, typo, "--out", tmp_path / "report")
    assert code == 2 and err == f"mixlab: error: no folder '{typo}'\n"
    assert not typo.exists() and not (tmp_path / "report").exists() and not (grid_dir / "report.md").exists()
    (tmp_path / "a.json").write_text("{}")
    code, _, err = report_cli(capsys, tmp_path / "a.json")
    assert code == 2 and err == f"mixlab: error: '{tmp_path / 'a.json'}' is not a folder\n"
    (tmp_path / "empty").mkdir()
    code, _, err = report_cli(capsys, tmp_path / "empty")
    assert code == 2 and err.startswith(f"mixlab: error: '{tmp_path / 'empty'}' holds no run records")
    assert list((tmp_path / "empty").iterdir()) == []


# ---- single runs: one row each, beside the sweeps of the same folder


def test_single_runs_are_tabulated(single_runs, capsys, tmp_path):
    code, out, err = report_cli(capsys, single_runs, "--out", tmp_path / "report")
    assert code == 0, err
    assert out.strip().endswith("report.md, runs_runs.csv, runs_curves.png")
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"## Single runs: `{single_runs}`" in report
    for path in sorted(single_runs.glob("*.json")):
        record = json.loads(path.read_text())
        row = table_row(report, path.stem)
        mixer = record["config"]["model"]["mixer"]
        assert row[1:5] == ["mqar", "num_kv_pairs=4 seq_len=32 vocab_size=64", mixer, "16"]
        assert row[-5:] == [str(record["steps"]), str(record["final"]["best_epoch"]),
                            f"{record['final']['acc_micro']:.4g}", f"{record['final']['acc_macro']:.4g}",
                            f"{record['final']['test_ppl']:.4g}"]
    with (tmp_path / "report" / "runs_runs.csv").open() as f:
        assert sorted(r["model"] for r in csv.DictReader(f)) == ["attention", "static_conv"]


def test_a_folder_of_single_runs_and_sweeps_reports_both(single_runs, grid_dir, tmp_path, capsys):  # noqa: F811
    # the default layout: `mixlab run` writes runs/<name>.json, `mixlab sweep` runs/sweeps/<name>/
    folder = shutil.copytree(single_runs, tmp_path / "runs")
    shutil.copytree(grid_dir, folder / "sweeps" / "widths")
    (folder / "broken.json").write_text("[1, 2]")
    code, out, err = report_cli(capsys, folder)
    assert code == 0, err
    report = (folder / "report.md").read_text()
    assert f"Folders: `{folder}`, `{folder / 'sweeps' / 'widths'}`" in report
    assert "## widths" in report and f"## Single runs: `{folder}`" in report
    assert f"  `{folder / 'broken.json'}`: not a run record (no 'config')" in out.splitlines()
    assert f"- `{folder}`: each with the `mixlab run` command that wrote it" in report
