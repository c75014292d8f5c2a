"""``mixlab report``: every table and figure of one or more sweep folders, written into one folder.

MAD folders (one model each) share one MAD table and one per-task bar chart; every grid folder gets its own
summary table and, when it varies d_model, an accuracy-against-width figure. Files written::

    report.md                     the tables (markdown) with links to the figures
    mad_tasks.csv                 model, task, median, q25, q75, iqr, n, reference, diff
    mad_settings.csv              best grid point per (model, task, setting, seed)
    mad_tasks.png                 per-task bars, median and IQR over seeds, one dot per seed
    <sweep>_summary.csv           per grid folder: median / IQR / n over seeds of the best training point
    <sweep>_acc_vs_width.png      per grid folder that varies d_model
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from analysis import plots
from analysis.aggregate import SweepData, best_of_grid, load_sweep
from analysis.tables import (
    grid_table,
    mad_entry,
    mad_references,
    mad_seed_rows,
    mad_setting_rows,
    mad_setting_table,
    mad_task_rows,
    mad_text,
    write_csv,
)


def write_report(folders: Sequence[str | Path], out: str | Path | None = None) -> list[Path]:
    """Write report.md, CSVs and PNGs for ``folders`` into ``out`` (default: the one folder given)."""
    if not folders:
        raise ValueError("give at least one sweep folder")
    if out is None:
        if len(folders) > 1:
            raise ValueError("several folders need --out for the report")
        out = folders[0]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    datas = [load_sweep(f) for f in folders]
    written: list[Path] = []
    sections = ["# Sweep report", "", "Folders: " + ", ".join(f"`{d.path}`" for d in datas), ""]

    mads = [d for d in datas if d.kind == "mad"]
    if mads:
        entries = [mad_entry(d) for d in mads]
        written.append(write_csv(out / "mad_tasks.csv", mad_task_rows(entries)))
        written.append(write_csv(out / "mad_settings.csv", mad_setting_rows(entries)))
        written.append(plots.mad_task_bars(mad_seed_rows(entries), out / "mad_tasks.png",
                                           references=mad_references(entries)))
        sections += ["## MAD", "", mad_text(entries), "", "![MAD per task](mad_tasks.png)", "",
                     "### Per setting (median over seeds of the best grid point)", "",
                     mad_setting_table(entries).markdown(), ""]

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
                 f"Best training point per seed by {data.metric}, then median [IQR] and n over seeds.", "",
                 table.markdown(), ""]
    if len({r["d_model"] for r in data.rows}) > 1:
        best = best_of_grid(data.rows, ("task", "setting", "model", "d_model", "seed"), data.metric)
        figure = plots.accuracy_vs_width(best, data.metric, out / f"{name}_acc_vs_width.png", title=name)
        written.append(figure)
        sections += [f"![{name}: accuracy against width]({figure.name})", ""]
    return written
