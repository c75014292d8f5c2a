"""Figures of sweep results (seaborn, headless): MAD per-task bars with the seed spread; accuracy vs width;
per-model bars of a grid's metric and score groups.

Bars and lines show the median over seeds with the interquartile range (seaborn's ``errorbar=("pi", 50)``),
and the bars carry one dot per seed, so a single seed reads as a bar without a spread. The dots are not jittered:
seaborn's jitter draws from numpy's global RNG, and a report regenerated from the same records must be the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on CI or GPU boxes; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402 - seaborn's own dependency
import seaborn as sns  # noqa: E402
from mixlab.analysis.aggregate import AVERAGE  # noqa: E402
from mixlab.analysis.tables import MAD_ROWS  # noqa: E402

IQR = ("pi", 50)


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
    grid = sns.relplot(frame, x="d_model", y=metric, hue="model", col="panel", kind="line", marker="o",
                       estimator=np.median, errorbar=IQR, col_wrap=min(3, frame["panel"].nunique()),
                       height=3.5, aspect=1.2, facet_kws={"sharey": True})
    widths = sorted(frame["d_model"].unique())
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set(ylim=(0, 1.02), xlabel="d_model", ylabel=f"{metric} (median, IQR over seeds)")
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


def _save(fig: plt.Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
