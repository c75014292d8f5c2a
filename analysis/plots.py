"""Figures of sweep results (seaborn, headless): MAD per-task bars with the seed spread; accuracy vs width and vs
sequence length (or number of key-value pairs); per-model bars of a grid's metric and score groups; learning
curves (test accuracy and loss against the optimizer step).

Bars and lines show the median over seeds with the interquartile range (seaborn's ``errorbar=("pi", 50)``),
and the bars carry one dot per seed, so a single seed reads as a bar without a spread. The dots are not jittered:
seaborn's jitter draws from numpy's global RNG, and a report regenerated from the same records must be the same.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on CI or GPU boxes; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402 - seaborn's own dependency
import seaborn as sns  # noqa: E402
from mixlab.analysis.aggregate import AVERAGE, varying_task_params  # noqa: E402
from mixlab.analysis.tables import MAD_ROWS  # noqa: E402

IQR = ("pi", 50)
# line dashes of learning curves past the tenth colour ("" is solid)
DASHES = ("", (4, 2), (1, 1.5), (6, 2, 1, 2))


def mad_task_bars(seed_rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "MAD",
                  references: Mapping[str, Mapping[str, float]] | None = None) -> Path:
    """Per-task bars of the MAD score (rows: model, task, seed, score; ``tables.mad_seed_rows``), with a red
    dash at each model's reference value where ``references`` (model -> task -> value) has one."""
    frame = pd.DataFrame(list(seed_rows))
    if frame.empty:
        raise ValueError("no MAD scores to plot")
    order = [t for t in MAD_ROWS if t in set(frame["task"])]
    hues = list(dict.fromkeys(frame["model"]))
    fig, ax = plt.subplots(figsize=(1.6 * len(order) + 3, 4.2))
    sns.barplot(frame, x="task", y="score", hue="model", order=order, hue_order=hues, estimator=np.median,
                errorbar=IQR, capsize=0.15, err_kws={"linewidth": 1}, ax=ax)
    sns.stripplot(frame, x="task", y="score", hue="model", order=order, hue_order=hues, dodge=True,
                  palette="dark:black", size=3, jitter=False, legend=False, ax=ax)
    width = 0.8 / len(hues)  # seaborn's dodge: the hues share 0.8 of each category's slot
    label = "dynamic-conv paper"
    for j, model in enumerate(hues):
        for i, task in enumerate(order):
            ref = (references or {}).get(model, {}).get(task)
            if ref is not None:
                x = i - 0.4 + (j + 0.5) * width
                ax.hlines(ref, x - width / 2, x + width / 2, colors="red", linestyles="--", linewidth=1.5,
                          label=label)
                label = None  # one legend entry for all the dashes
    if AVERAGE in order:
        ax.axvline(order.index(AVERAGE) - 0.5, color="grey", linewidth=0.8)
    ax.set(xlabel="", ylabel="score (median, IQR over seeds)", ylim=(0, 1.05), title=title)
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", frameon=False)
    return _save(fig, path)


def accuracy_vs_width(best_rows: Sequence[Mapping[str, Any]], metric: str, path: str | Path,
                      title: str = "") -> Path:
    """Accuracy against d_model, one line per model, one panel per (task, setting).

    best_rows: one row per (task, setting, model, d_model, seed), the best training point of each
    (``aggregate.best_of_grid``); the line is the median over seeds, the band the IQR.
    """
    frame = pd.DataFrame(list(best_rows))
    if frame.empty:
        raise ValueError("no rows to plot")
    frame["panel"] = frame["task"] + " " + frame["setting"].where(frame["setting"] != "default", "")
    widths = sorted(frame["d_model"].unique())
    return _line_panels(frame, "d_model", metric, {w: str(w) for w in widths}, "d_model", path, title)


def accuracy_vs_length(best_rows: Sequence[Mapping[str, Any]], param: str, metric: str, path: str | Path,
                       title: str = "") -> Path:
    """Accuracy against the task parameter ``param`` (``aggregate.length_param``: seq_len or num_kv_pairs), one
    line per model, one panel per (task, d_model); rows as for ``accuracy_vs_width``. What it draws:
    ``length_frame``."""
    frame, xlabel = length_frame(best_rows, param, metric)
    ticks = dict(sorted(zip(frame[param], frame["tick"])))
    return _line_panels(frame, param, metric, ticks, xlabel, path, title)


def length_frame(best_rows: Sequence[Mapping[str, Any]], param: str, metric: str) -> tuple[pd.DataFrame, str]:
    """The points ``accuracy_vs_length`` draws, one per best row whose task has ``param``: task, model, seed,
    d_model, the metric, ``param``'s value, its tick label and the panel; and the x axis's label.

    Another task parameter that varies with one value per value of ``param`` (Zoology's pairs scaled with the
    length) is written under each tick (``64/4``, axis ``seq_len/num_kv_pairs``); one that varies otherwise
    splits the panels, so that a line joins runs that differ in ``param`` alone.
    """
    rows = [r for r in best_rows if param in r["task_params"]]
    if not rows:
        raise ValueError(f"no rows with the task parameter {param!r} to plot")
    others = [p for p in varying_task_params(rows) if p != param]
    frame = pd.DataFrame([{"task": r["task"], "model": r["model"], "seed": r["seed"], "d_model": r["d_model"],
                           metric: r[metric], param: r["task_params"][param],
                           **{p: str(r["task_params"].get(p)) for p in others}} for r in rows])
    # the models' colours in the sweep's order, as in the width figure, whatever the sort below puts first
    frame["model"] = pd.Categorical(frame["model"], categories=list(dict.fromkeys(frame["model"])))
    follow = [p for p in others if (frame.groupby(param)[p].nunique() == 1).all()]
    split = [p for p in others if p not in follow]
    frame = frame.sort_values(["task", "d_model", *split, param], kind="stable", ignore_index=True)
    frame["tick"] = frame[[param, *follow]].astype(str).agg("/".join, axis=1)
    frame["panel"] = frame["task"] + " d_model=" + frame["d_model"].astype(str)
    for p in split:
        frame["panel"] += f" {p}=" + frame[p]
    return frame, "/".join([param, *follow])


def _line_panels(frame: pd.DataFrame, x: str, metric: str, ticks: Mapping[Any, str], xlabel: str,
                 path: str | Path, title: str) -> Path:
    """The metric against ``x`` (log 2 axis, ``ticks``: value -> label), one line per model with its median and
    IQR over the rows at each point, one panel per value of the frame's ``panel``."""
    grid = sns.relplot(frame, x=x, y=metric, hue="model", col="panel", kind="line", marker="o",
                       estimator=np.median, errorbar=IQR, col_wrap=min(3, frame["panel"].nunique()),
                       height=3.5, aspect=1.2, facet_kws={"sharey": True})
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.set(ylim=(0, 1.02), xlabel=xlabel, ylabel=f"{metric} (median, IQR over seeds)")
    grid.set_titles("{col_name}")
    if title:
        grid.figure.suptitle(title, y=1.02)
    return _save(grid.figure, path)


def grid_bars(best_rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], path: str | Path,
              title: str = "", references: Mapping[tuple[str, str], float] | None = None) -> Path:
    """Bars of each metric per model, one panel per (task, setting), one dot per seed.

    best_rows: one row per (task, setting, model, model point, seed), the best training point of each; a metric a
    task lacks (e.g. acc_absent outside associative retrieval) is left out of its panel. ``references`` ((task,
    model) -> value) draws the paper's value of the first metric as a red dash on that model's bar.
    """
    frame = pd.DataFrame(list(best_rows))
    if frame.empty:
        raise ValueError("no rows to plot")
    frame["panel"] = frame["task"] + " " + frame["setting"].where(frame["setting"] != "default", "")
    long = frame.melt(id_vars=["panel", "task", "model", "seed"], value_vars=[m for m in metrics if m in frame],
                      var_name="metric", value_name="value").dropna(subset=["value"])
    panels = list(dict.fromkeys(long["panel"]))
    models = list(dict.fromkeys(long["model"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.5, 4.2), squeeze=False,
                             sharey=True)
    for ax, panel in zip(axes[0], panels):
        part = long[long["panel"] == panel]
        order = [m for m in metrics if m in set(part["metric"])]
        sns.barplot(part, x="metric", y="value", hue="model", order=order, hue_order=models, estimator=np.median,
                    errorbar=IQR, capsize=0.15, err_kws={"linewidth": 1}, ax=ax)
        sns.stripplot(part, x="metric", y="value", hue="model", order=order, hue_order=models, dodge=True,
                      palette="dark:black", size=3, jitter=False, legend=False, ax=ax)
        width = 0.8 / len(models)
        task = part["task"].iloc[0]
        for j, model in enumerate(models):
            ref = (references or {}).get((task, model))
            if ref is not None:
                x = -0.4 + (j + 0.5) * width  # the first metric's slot
                ax.hlines(ref, x - width / 2, x + width / 2, colors="red", linestyles="--", linewidth=1.5)
        ax.set(title=panel.strip(), xlabel="", ylabel="median, IQR over seeds", ylim=(0, 1.05))
        if ax is not axes[0][-1]:
            ax.get_legend().remove()
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", frameon=False)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def learning_curves(rows: Sequence[Mapping[str, Any]], metric: str, path: str | Path, *, title: str = "",
                    per_run: bool = False) -> Path:
    """Test accuracy (``metric``) above test loss (log scale), against the optimizer step, for each panel of the
    rows (``tables.curve_rows``: panel, line, run, step, the metric, test_loss). Each line is the median over its
    runs (a cell's seeds) at each evaluation, with the interquartile band; with ``per_run`` (single runs) each run
    is its own line instead. A run that stopped early leaves the runs still training to the median after it."""
    frame = pd.DataFrame(list(rows))
    if frame.empty:
        raise ValueError("no evaluations to plot")
    panels = list(dict.fromkeys(frame["panel"]))
    lines = list(dict.fromkeys(frame["line"]))
    # ten distinct colours, then the same ten dashed, dotted, ...: no two lines alike however many
    colours = {line: sns.color_palette("tab10")[i % 10] for i, line in enumerate(lines)}
    dashes = {line: DASHES[i // 10 % len(DASHES)] for i, line in enumerate(lines)}
    cols = min(4, len(panels))
    rows_of_panels = -(-len(panels) // cols)
    fig, axes = plt.subplots(2 * rows_of_panels, cols, figsize=(3.6 * cols + 2, 2.4 * 2 * rows_of_panels),
                             squeeze=False)
    how = ({"units": "run", "estimator": None} if per_run else {"estimator": np.median, "errorbar": IQR})
    for i, panel in enumerate(panels):
        part = frame[frame["panel"] == panel]
        top, bottom = axes[2 * (i // cols)][i % cols], axes[2 * (i // cols) + 1][i % cols]
        for ax, y in ((top, metric), (bottom, "test_loss")):
            sns.lineplot(part, x="step", y=y, hue="line", hue_order=lines, palette=colours, style="line",
                         style_order=lines, dashes=dashes, ax=ax, legend=False, **how)
        top.set_title(textwrap.fill(panel.strip(), 36), fontsize="small")
        top.set(xlabel="", ylabel=metric, ylim=(0, 1.02))
        bottom.set(xlabel="step", ylabel="test loss", yscale="log")
    for i in range(len(panels), rows_of_panels * cols):
        axes[2 * (i // cols)][i % cols].axis("off")
        axes[2 * (i // cols) + 1][i % cols].axis("off")
    handles = [plt.Line2D([], [], color=colours[line], dashes=dashes[line], label=line) for line in lines]
    spread = "one line per run" if per_run else "median and IQR over seeds"
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False,
               title=spread)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: plt.Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
