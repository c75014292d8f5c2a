"""``mixlab report``: every table and figure of one or more sweep folders, written into one folder.

MAD folders (one model each) share one MAD table and one per-task bar chart; every grid folder gets its own
summary table and, when it varies d_model, an accuracy-against-width figure. Files written::

    report.md                     the tables (markdown) with links to the figures
    mad_tasks.csv                 model, task, median, q25, q75, iqr, n, reference, diff
    mad_settings.csv              best grid point per (model, task, setting, seed)
    mad_tasks.png                 per-task bars, median and IQR over seeds, one dot per seed
    <sweep>_summary.csv           per grid folder: median / IQR / n over seeds of the best training point
    <sweep>_acc_vs_width.png      per grid folder that varies d_model
    <sweep>_bars.png              per grid folder of one width: its metric and score groups per model
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mixlab.analysis import plots
from mixlab.analysis.aggregate import MANIFEST, METRIC_KEYS, RUNS, SweepData, best_of_grid, load_sweep
from mixlab.analysis.tables import (
    REFERENCE,
    grid_table,
    mad_budget_table,
    mad_entry,
    mad_references,
    mad_seed_rows,
    mad_setting_rows,
    mad_setting_table,
    mad_task_rows,
    mad_text,
    reference_name,
    write_csv,
)


def sweep_folders(folder: str | Path) -> list[Path]:
    """``folder`` itself when it holds a sweep (``runs/`` or a manifest), else its sub-folders that do (a
    collection such as ``reproductions/mad``: one folder per model), sorted by name."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / RUNS).is_dir() or (folder / MANIFEST).is_file():
        return [folder]
    inner = sorted(p for p in folder.iterdir() if (p / RUNS).is_dir() or (p / MANIFEST).is_file())
    return inner or [folder]


def write_report(folders: Sequence[str | Path], out: str | Path | None = None) -> list[Path]:
    """Write report.md, CSVs and PNGs for ``folders`` into ``out`` (default: the one folder given). A folder
    that holds sweep folders rather than runs stands for all of them (``sweep_folders``)."""
    if not folders:
        raise ValueError("give at least one sweep folder")
    if out is None:
        if len(folders) > 1:
            raise ValueError("several folders need --out for the report")
        out = folders[0]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    datas = [load_sweep(f) for folder in folders for f in sweep_folders(folder)]
    written: list[Path] = []
    sections = ["# Sweep report", "", "Folders: " + ", ".join(f"`{d.path}`" for d in datas), ""]

    # the reference table's column order (transformer, static, dynamic), then the rest as given
    order = list(REFERENCE)
    mads = sorted((d for d in datas if d.kind == "mad"),
                  key=lambda d: order.index(reference_name(d)) if reference_name(d) in order else len(order))
    if mads:
        entries = [mad_entry(d) for d in mads]
        written.append(write_csv(out / "mad_tasks.csv", mad_task_rows(entries)))
        written.append(write_csv(out / "mad_settings.csv", mad_setting_rows(entries)))
        written.append(plots.mad_task_bars(mad_seed_rows(entries), out / "mad_tasks.png",
                                           references=mad_references(entries)))
        sections += ["## MAD", "", mad_text(entries), "", "![MAD per task](mad_tasks.png)", "",
                     "### Per setting (median over seeds of the best grid point)", "",
                     mad_setting_table(entries).markdown(), "",
                     "### Runs still improving when their budget ended", "",
                     "Of the scored runs (the best grid point of each setting and seed), those whose lowest-"
                     "perplexity evaluation was their last and that did not stop early: their test perplexity was "
                     "still falling when training ended, so these are the runs a longer budget could change.", "",
                     mad_budget_table(entries).markdown(), ""]

    for data in (d for d in datas if d.kind != "mad"):
        written += _grid_section(data, out, sections)

    report = out / "report.md"
    report.write_text("\n".join(sections))
    return [report, *written]


def _grid_section(data: SweepData, out: Path, sections: list[str]) -> list[Path]:
    table, summary = grid_table(data)
    name = data.name
    written = [write_csv(out / f"{name}_summary.csv", summary)]
    description = data.spec.get("description", "")
    missing = f" ({data.missing} planned runs have no record yet)" if data.missing else ""
    sections += [f"## {name}", "", f"{description}{missing}".strip(), "",
                 f"Best training point per seed by {data.metric}, then median [IQR] and n over seeds; still "
                 "improving: of those best runs, how many had their lowest test perplexity at their last "
                 "evaluation without stopping early (a longer budget could change them).", "",
                 table.markdown(), ""]
    reference = data.spec.get("reference") or {}
    if reference.get("source") or reference.get("claims"):
        sections += [f"Paper: {reference.get('source', '')}".rstrip(": "), "",
                     *(f"- {claim}" for claim in reference.get("claims", [])), ""]
    if len({r["d_model"] for r in data.rows}) > 1:
        best = best_of_grid(data.rows, ("task", "setting", "model", "d_model", "seed"), data.metric)
        figure = plots.accuracy_vs_width(best, data.metric, out / f"{name}_acc_vs_width.png", title=name)
        written.append(figure)
        sections += [f"![{name}: accuracy against width]({figure.name})", ""]
    else:  # one width: bars of the metric and the score groups, per model
        best = best_of_grid(data.rows, ("task", "setting", "model", "model_grid", "seed"), data.metric)
        groups = sorted({k for r in best for k in r if k.startswith("acc_") and k not in METRIC_KEYS})
        papers = {(v["task"], v["model"]): v["value"] for v in data.spec.get("reference", {}).get("values", [])
                  if v.get("value") is not None}
        figure = plots.grid_bars(best, [data.metric, *groups], out / f"{name}_bars.png", title=name,
                                 references=papers)
        written.append(figure)
        sections += [f"![{name}: {data.metric} and score groups per model]({figure.name})", ""]
    return written
