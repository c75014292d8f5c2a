"""``mixlab report``: every table and figure of one or more folders of run records, written into one folder.

A folder given is a sweep folder, or holds sweep folders (a collection such as ``reproductions/mad``), the
records of single runs (``mixlab run --out``), or both (``find_folders``). MAD folders (one model each) share one
MAD table and one per-task bar chart; every grid folder gets its own summary table and, when it varies d_model, an
accuracy-against-width figure (else bars per model), and when it varies seq_len or num_kv_pairs, an
accuracy-against-length figure; every folder of single runs gets a table with one row per run. Files written::

    report.md                     the tables (markdown) with links to the figures, the verdicts of the papers'
                                  claims (analysis.claims: the MAD table's, a grid's reference.claims), and
                                  where the records trained (devices and versions, ``provenance_section``)
    mad_tasks.csv                 model, task, median, q25, q75, iqr, n, reference, diff
    mad_epochs.csv                model, task, epoch rule, median, q25, q75, iqr, n: the MAD table at the
                                  lowest-perplexity evaluation and at the last (aggregate.EPOCH_RULES)
    mad_settings.csv              best grid point per (model, task, setting, seed)
    mad_tasks.png                 per-task bars, median and IQR over seeds, one dot per seed
    <sweep>_summary.csv           per grid folder: median / IQR / n over seeds of the best training point
    <sweep>_acc_vs_width.png      per grid folder that varies d_model
    <sweep>_acc_vs_length.png     per grid folder that varies seq_len (else num_kv_pairs): a panel per width
    <sweep>_bars.png              per grid folder of one width: its metric and score groups per model
    <sweep>_curves.png            per grid folder: learning curves of each cell's best training point per seed
    mad_curves.png                learning curves of the MAD tasks' baseline settings, per model
    <folder>_runs.csv             per folder of single runs: one row per run
    <folder>_curves.png           per folder of single runs: one learning curve per run

Learning curves (``plots.learning_curves``) draw each record's evaluation history: test accuracy and test loss
against the optimizer step, a line per model with its median and IQR over seeds (one line per run for single
runs).

A file where a record should be that cannot be read is named, with the reason, at the top of report.md (and by
``unreadable_lines`` for the command line) with the command that retrains its run; its cells read as partial.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mixlab.analysis import plots
from mixlab.analysis.aggregate import (
    GRID_CELL,
    MAD_TASK_NAMES,
    MANIFEST,
    METRIC_KEYS,
    RUNS,
    SweepData,
    Unreadable,
    best_of_grid,
    length_param,
    load_runs,
    load_sweep,
)
from mixlab.analysis.claims import grid_verdicts, mad_verdicts, sweep_claims, verdict_lines
from mixlab.analysis.tables import (
    EPOCH_MOVED,
    REFERENCE,
    SOLVED_AT,
    MadEntry,
    curve_rows,
    grid_table,
    mad_budget_table,
    mad_entry,
    mad_epoch_moves,
    mad_epoch_rows,
    mad_epoch_setting_moves,
    mad_epoch_table,
    mad_references,
    mad_seed_rows,
    mad_setting_rows,
    mad_setting_table,
    mad_solved_table,
    mad_task_rows,
    mad_text,
    reference_name,
    runs_table,
    write_csv,
)


def find_folders(folder: str | Path) -> list[tuple[Path, bool]]:
    """The folders of run records in ``folder`` as (path, single runs?): ``folder`` itself when it holds a sweep
    (``runs/`` or a manifest); else its own ``*.json`` records as single runs, then what its sub-folders hold, by
    name (hidden ones left out). ValueError naming ``folder`` when it holds neither."""
    found = _walk(Path(folder))
    if not found:
        raise ValueError(f"{str(folder)!r} holds no run records (neither a sweep's {RUNS}/<hash>.json nor the "
                         "<name>.json records of mixlab run)")
    return found


# The folder of the checkpoints of runs stopped in mid-training (runners.train.resume.PARTIAL): its .json files
# describe checkpoints, not records.
PARTIAL = "partial"


def _walk(folder: Path) -> list[tuple[Path, bool]]:
    if (folder / RUNS).is_dir() or (folder / MANIFEST).is_file():
        return [(folder, False)]
    found = [(folder, True)] if any(folder.glob("*.json")) else []
    for inner in sorted(p for p in folder.iterdir()
                        if p.is_dir() and not p.name.startswith(".") and p.name != PARTIAL):
        found += _walk(inner)
    return found


def read_folders(folders: Sequence[str | Path]) -> list[SweepData]:
    """Every sweep and folder of single runs in ``folders`` (``find_folders``), read; a path that is not a folder
    is refused (ValueError naming it) before anything is read."""
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise ValueError(f"{str(folder)!r} is not a folder" if folder.exists() else f"no folder {str(folder)!r}")
    return [load_runs(path) if single else load_sweep(path)
            for folder in folders for path, single in find_folders(folder)]


def report_folder(folders: Sequence[str | Path], out: str | Path | None) -> Path:
    """Where the report goes: ``out``, else the one folder given."""
    if out is not None:
        return Path(out)
    if len(folders) > 1:
        raise ValueError("several folders need --out for the report")
    if not folders:
        raise ValueError("give at least one sweep folder")
    return Path(folders[0])


def _distinct_labels(entries: list[MadEntry], datas: list[SweepData]) -> list[MadEntry]:
    """Entries whose column labels collide (two folders of one model and profile, e.g. runs trained under
    earlier rules kept beside new ones) are named by their folders instead of their models."""
    counts = Counter((data.label, entry.profile) for entry, data in zip(entries, datas, strict=True))
    return [dataclasses.replace(entry, label=entry.label.replace(data.label, data.path.name, 1))
            if counts[data.label, entry.profile] > 1 else entry for entry, data in zip(entries, datas, strict=True)]


def write_report(folders: Sequence[str | Path], out: str | Path | None = None) -> list[Path]:
    """Write report.md, CSVs and PNGs for ``folders`` into ``out`` (default: the one folder given). A folder
    that holds sweep folders or single runs stands for all of them (``find_folders``). Nothing is written, no
    folder made, unless every folder given exists and holds records."""
    out = report_folder(folders, out)
    return render_report(read_folders(folders), out)


def render_report(datas: Sequence[SweepData], out: str | Path) -> list[Path]:
    """Write report.md, CSVs and PNGs of the folders read (``read_folders``) into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sections = ["# Sweep report", "", "Folders: " + ", ".join(f"`{d.path}`" for d in datas), ""]
    sections += _unreadable_section(datas)

    # the reference table's column order (transformer, static, dynamic), then the rest as given
    order = list(REFERENCE)
    mads = sorted((d for d in datas if d.kind == "mad"),
                  key=lambda d: order.index(reference_name(d)) if reference_name(d) in order else len(order))
    if mads:
        entries = _distinct_labels([mad_entry(d) for d in mads], mads)
        written.append(write_csv(out / "mad_tasks.csv", mad_task_rows(entries)))
        written.append(write_csv(out / "mad_epochs.csv", mad_epoch_rows(entries)))
        written.append(write_csv(out / "mad_settings.csv", mad_setting_rows(entries)))
        seed_rows = mad_seed_rows(entries)
        figure = out / "mad_tasks.png"
        if seed_rows:
            written.append(plots.mad_task_bars(seed_rows, figure, references=mad_references(entries)))
            drawn = "![MAD per task](mad_tasks.png)"
        else:
            # a sweep begun on the GPU is reported before any task of any seed has all its runs; an older
            # figure left in the folder would show scores this report no longer has
            figure.unlink(missing_ok=True)
            drawn = "No task has all its runs for any seed yet: nothing to draw."
        sections += ["## MAD", "", mad_text(entries), "", drawn, ""]
        curves = _mad_curves(entries, mads, out / "mad_curves.png")
        sections += ["### Learning curves of the baseline settings", "",
                     "Each model's best grid point per seed on each task's baseline setting: " + CURVES_TEXT, "",
                     "![MAD learning curves](mad_curves.png)" if curves else "No baseline setting has a record "
                     "yet: nothing to draw.", ""]
        written += [curves] if curves else []
        sections += epoch_section(entries)
        sections += ["### Per setting (median over seeds of the best grid point)", "",
                     mad_setting_table(entries).markdown(), "",
                     "### Runs still improving when their budget ended", "",
                     "Of the scored runs (the best grid point of each setting and seed), those whose lowest-"
                     "perplexity evaluation was their last and that did not stop early: their test perplexity was "
                     "still falling when training ended, so these are the runs a longer budget could change.", "",
                     mad_budget_table(entries).markdown(), ""]
        solved = mad_solved_table(entries)
        if solved is not None:
            sections += [f"### Settings that split between seeds (solved: best grid point >= {SOLVED_AT})", "",
                         "Seeds whose best grid point solves the setting, of the seeds scored, where some model "
                         "solves it on some seeds and not on others: a median hides that share.", "",
                         solved.markdown(), ""]
        judged = [d for d in mads if _profile(d) not in UNJUDGED_PROFILES]
        for profile, verdicts in mad_verdicts(judged).items():
            sections += [f"### The paper's claims, {profile} profile", "", *verdict_lines(verdicts)]
        for profile in dict.fromkeys(_profile(d) for d in mads if _profile(d) in UNJUDGED_PROFILES):
            sections += [f"### The paper's claims, {profile} profile", "",
                         f"Not judged: {UNJUDGED_PROFILES[profile]}.", ""]

    grids = [d for d in datas if d.kind == "grid"]
    # two folders of one sweep (e.g. the same preset run on the CPU and on a GPU) would write the same files:
    # those are named by their folders instead
    names = Counter(d.name for d in grids)
    for data in grids:
        written += _grid_section(data, out, sections, data.path.name if names[data.name] > 1 else data.name)
    for data in (d for d in datas if d.kind == "runs"):
        written += _runs_section(data, out, sections)

    sections += provenance_section(datas)
    report = out / "report.md"
    report.write_text("\n".join(sections))
    return [report, *written]


# MAD profiles too small for the paper's claims to mean anything, and why
UNJUDGED_PROFILES = {"smoke": "the smoke profile checks that the protocol runs end to end (2 epochs of at most 64 "
                              "rows at d_model 32: a few dozen steps), and its scores say nothing of the paper's "
                              "claims; the quick and paper profiles judge them"}


def _profile(data: SweepData) -> str | None:
    return (data.spec.get("profile") or {}).get("name")


def epoch_section(entries: Sequence[MadEntry]) -> list[str]:
    """The MAD table at both reported epochs, then the cells and the settings the choice moves by more than
    EPOCH_MOVED."""
    lines = ["### The reported epoch: lowest test perplexity or last evaluation", "",
             "Each run's metrics are those of its evaluation with the lowest test perplexity (mad-lab's rule: the "
             "best checkpoint, which its final validation loads), as in the table above; beside them, the same "
             "table from each run's last evaluation (where it stopped early, or where its budget ended), the best "
             "grid point chosen again under that rule. moved: the last evaluation's median minus the lowest "
             "perplexity's. From the records' evaluation histories; nothing retrained.", "",
             mad_epoch_table(entries).markdown(), ""]
    for title, table in ((f"Cells the rule moves by more than {EPOCH_MOVED}", mad_epoch_moves(entries)),
                         (f"Settings the rule moves by more than {EPOCH_MOVED} (median over seeds of the best "
                          "grid point)", mad_epoch_setting_moves(entries))):
        lines += [f"{title}:", "", table.markdown() if table else "none.", ""]
    return lines


# what a record says it trained with (``runners.train.provenance``) that can change its numbers, as report columns
PROVENANCE = ("torch", "triton", "fla-core", "fla-core chunk_bwd_dqkwg")


def provenance_section(datas: Sequence[SweepData]) -> list[str]:
    """report.md's last section: per folder, how many records trained on each device and set of versions."""
    counts: Counter = Counter()
    for data in datas:
        for rec in data.records:
            versions = rec.get("versions") or {}
            device = (rec.get("device") or {}).get("name", "not recorded")
            counts[(str(data.path), device, *(versions.get(k, "-") for k in PROVENANCE))] += 1
    if not counts:
        return []
    return ["## Where the records trained", "",
            "Records by folder, device and the versions that can change their numbers (`-`: not recorded; "
            "`fla-core chunk_bwd_dqkwg`: the lab's plain-torch stand-in for the kernel fla refuses, named where the "
            "record's model runs it, docs/mixers.md).", "",
            "| folder | device | " + " | ".join(PROVENANCE) + " | records |",
            "|---" * (len(PROVENANCE) + 3) + "|",
            *(f"| `{key[0]}` | " + " | ".join(key[1:]) + f" | {n} |" for key, n in sorted(counts.items())), ""]


def unreadable_lines(datas: Sequence[SweepData]) -> list[str]:
    """What the command line says about files that could not be read (none: nothing): each one with its
    reason and run, then how to retrain them."""
    bad = [(data, item) for data in datas for item in data.unreadable]
    if not bad:
        return []
    return [f"warning: {_unreadable_summary(len(bad))}:", *(f"  {_unreadable_text(d, u)}" for d, u in bad),
            f"{RETRAIN}:", *(f"  {retrain_hint(d)}" for d in datas if d.unreadable)]


RETRAIN = "To retrain them, delete these files and run again what wrote them (runs that have a record are skipped)"


def _unreadable_section(datas: Sequence[SweepData]) -> list[str]:
    bad = [(data, item) for data in datas for item in data.unreadable]
    if not bad:
        return []
    return ["## Unreadable records", "", f"{_unreadable_summary(len(bad))}.", "",
            *(f"- {_unreadable_text(d, u)}" for d, u in bad), "", f"{RETRAIN}:", "",
            *(f"- {retrain_hint(d)}" for d in datas if d.unreadable), ""]


def _unreadable_summary(count: int) -> str:
    files = "1 file" if count == 1 else f"{count} files"
    return (f"{files} where run records should be could not be read; the tables leave them out and mark the "
            "cells of their runs partial")


def _unreadable_text(data: SweepData, item: Unreadable) -> str:
    """``path: reason``, then the run it holds by the manifest's labels, where the folder has a manifest."""
    text = f"`{item.path}`: {item.reason}"
    if data.manifest is None:
        return text
    labels = data.run_labels(item.path.stem)
    if labels is None:
        return f"{text} (a run the manifest does not list)"
    parts = [labels["task"], labels["setting"], labels["model"], labels["model_grid"], labels["train_grid"]]
    return f"{text} (run: {', '.join(p for p in parts if p != 'default')}, seed {labels['seed']})"


def retrain_hint(data: SweepData) -> str:
    """How to train again the runs of ``data`` whose records could not be read: for a sweep with a manifest the
    command that resumes it (records are named by config hash, so only runs without a record train; the folder
    keeps their names on any device)."""
    folder = shlex.quote(str(data.path))
    if data.kind == "runs":
        return (f"`{data.path}`: each with the `mixlab run` command that wrote it (its task, --mixer, --set and "
                f"seeds), `--out {folder}`")
    if data.manifest is None:
        return f"`{data.path}`: the sweep that wrote it, with the same output folder"
    spec = data.spec
    seeds = sorted({run["meta"]["seed"] for run in data.manifest.get("runs", [])})
    options = f" --seeds {len(seeds)}" if seeds and seeds == list(range(len(seeds))) else ""
    if data.kind == "mad":
        profile = (spec.get("profile") or {}).get("name", "?")
        return f"`mixlab mad run --model {spec.get('model', data.label)} --profile {profile}{options} --out {folder}`"
    return f"`mixlab sweep {shlex.quote(_spec_argument(data.manifest))}{options} --out {folder}`"


def _spec_argument(manifest: dict[str, Any]) -> str:
    """The spec the sweep was started with (a preset name or a YAML path, as its command line gave it), else the
    sweep's name."""
    argv = manifest.get("argv") or []
    for word, after in zip(argv, argv[1:]):
        if word == "sweep" and not after.startswith("-"):
            return after
    return manifest.get("name", "?")


def _grid_section(data: SweepData, out: Path, sections: list[str], name: str) -> list[Path]:
    """The section of one grid sweep; ``name`` titles it and names its files."""
    table, summary = grid_table(data)
    written = [write_csv(out / f"{name}_summary.csv", summary)]
    description = data.spec.get("description", "")
    missing = f" ({data.missing} planned runs have no record yet)" if data.missing else ""
    sections += [f"## {name}", "", f"{description}{missing}".strip(), "",
                 f"Best training point per seed by {data.metric}, then median [IQR] and n over seeds, and where "
                 f"the seeds split at {SOLVED_AT} the share solved (a median hides a bimodal cell); still "
                 "improving: of those best runs, how many had their lowest test perplexity at their last "
                 "evaluation without stopping early (a longer budget could change them).", "",
                 table.markdown(), ""]
    sections += _claims_lines(data)
    best = best_of_grid(data.rows, ("task", "setting", "model", "d_model", "seed"), data.metric)
    if len({r["d_model"] for r in data.rows}) > 1:
        figure = plots.accuracy_vs_width(best, data.metric, out / f"{name}_acc_vs_width.png", title=name)
        written.append(figure)
        sections += [f"![{name}: accuracy against width]({figure.name})", ""]
    else:  # one width: bars of the metric and the score groups, per model
        bars = best_of_grid(data.rows, ("task", "setting", "model", "model_grid", "seed"), data.metric)
        groups = sorted({k for r in bars for k in r if k.startswith("acc_") and k not in METRIC_KEYS})
        papers = {(v["task"], v["model"]): v["value"] for v in data.spec.get("reference", {}).get("values", [])
                  if v.get("value") is not None}
        figure = plots.grid_bars(bars, [data.metric, *groups], out / f"{name}_bars.png", title=name,
                                 references=papers)
        written.append(figure)
        sections += [f"![{name}: {data.metric} and score groups per model]({figure.name})", ""]
    param = length_param(data.rows)
    if param is not None:  # Zoology's other MQAR figure: the metric against the length, per width
        figure = plots.accuracy_vs_length(best, param, data.metric, out / f"{name}_acc_vs_length.png", title=name)
        written.append(figure)
        sections += [f"![{name}: accuracy against {param}]({figure.name})", ""]
    cells = best_of_grid(data.rows, (*GRID_CELL, "seed"), data.metric)
    picks = [(r["hash"], _panel(r["task"], r["setting"], r["model_grid"]), r["model"]) for r in cells]
    figure = plots.learning_curves(curve_rows(data.records, picks, data.metric), data.metric,
                                   out / f"{name}_curves.png", title=name)
    written.append(figure)
    sections += [f"Learning curves of each cell's best training point per seed: {CURVES_TEXT}", "",
                 f"![{name}: learning curves]({figure.name})", ""]
    return written


CURVES_TEXT = ("test accuracy and test loss at each evaluation against the optimizer step, the median over seeds "
               "with the interquartile band (a seed that stopped early leaves the others to the median after it).")


def _panel(*labels: str) -> str:
    """A figure panel's title: the labels that are not ``default``."""
    return " ".join(label for label in labels if label != "default")


def _mad_curves(entries: Sequence[MadEntry], datas: Sequence[SweepData], path: Path) -> Path | None:
    """Per MAD task the curves of its baseline setting: per folder (its table column) the best grid point of each
    seed; None (and no older figure left) when no baseline setting has a record."""
    rows = []
    for entry, data in zip(entries, datas, strict=True):
        baseline = [r for r in data.rows if r["setting"] == "baseline"]
        picks = [(r["hash"], MAD_TASK_NAMES[r["task"]], entry.label)
                 for r in best_of_grid(baseline, ("task", "setting", "model", "seed"), data.metric)]
        rows += curve_rows(data.records, picks, data.metric)
    if not rows:
        path.unlink(missing_ok=True)
        return None
    order = list(MAD_TASK_NAMES.values())
    rows.sort(key=lambda row: order.index(row["panel"]))  # the panels in the table's order; stable within each
    return plots.learning_curves(rows, datas[0].metric, path, title="MAD, baseline settings")


def _claims_lines(data: SweepData) -> list[str]:
    """The paper a grid reproduces, its claims' verdicts, and any claim that is a sentence only."""
    reference = data.spec.get("reference") or {}
    checks, sentences = sweep_claims(data)
    if not (reference.get("source") or checks or sentences):
        return []
    lines = [f"Paper: {reference.get('source', '')}".rstrip(": "), ""]
    if checks:
        lines += verdict_lines(grid_verdicts(data))
    if sentences:
        lines += [*(f"- {text} (a sentence, not a check: no verdict)" for text in sentences), ""]
    return lines


def _runs_section(data: SweepData, out: Path, sections: list[str]) -> list[Path]:
    table, rows = runs_table(data)
    written = [write_csv(out / f"{data.name}_runs.csv", rows)]
    picks = [(record["name"], record["config"]["task"], record["name"]) for record in data.records]
    metric = "acc_micro"
    figure = plots.learning_curves(curve_rows(data.records, picks, metric), metric, out / f"{data.name}_curves.png",
                                   title=f"single runs: {data.path}", per_run=True)
    written.append(figure)
    sections += [f"## Single runs: `{data.path}`", "",
                 "One row per run record (`mixlab run`): its settings and the metrics of its lowest-perplexity "
                 "evaluation.", "", table.markdown(), "",
                 "Learning curves, one line per run: test accuracy and test loss at each evaluation against the "
                 "optimizer step.", "", f"![{data.path}: learning curves]({figure.name})", ""]
    return written
