"""Markdown and CSV tables of sweep results, and the MAD table beside the dynamic-conv paper's values.

MAD cells read ``median [IQR]`` over seeds of the task score (module ``analysis.aggregate``); ``ref`` is the
dynamic-conv paper's value (docs/mad.md) for the models it reports, ``diff`` is median minus ref.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mixlab import models
from mixlab.analysis.aggregate import (
    AVERAGE,
    COPY16,
    GRID_CELL,
    MAD_TASK_NAMES,
    METRIC_KEYS,
    MadScores,
    Stats,
    SweepData,
    grid_summary,
    mad_scores,
)

# The dynamic-conv paper's MAD table (docs/mad.md), keyed by models.PRESETS name.
REFERENCE: dict[str, dict[str, float]] = {
    "transformer": {"Compress": 0.375, "Fuzzy Recall": 0.298, "In-Context Recall": 0.942,
                    "Memorize": 0.791, "Noisy Recall": 0.917, "Selective Copy": 0.930, AVERAGE: 0.709},
    "static_conv_qkv": {"Compress": 0.417, "Fuzzy Recall": 0.505, "In-Context Recall": 1.000,
                        "Memorize": 0.856, "Noisy Recall": 1.000, "Selective Copy": 0.983, AVERAGE: 0.793},
    "dynamic_conv_qkv": {"Compress": 0.424, "Fuzzy Recall": 0.726, "In-Context Recall": 1.000,
                         "Memorize": 0.795, "Noisy Recall": 1.000, "Selective Copy": 0.988, AVERAGE: 0.822},
}
MAD_ROWS = (*MAD_TASK_NAMES.values(), AVERAGE)
SELECTIVE_COPY = MAD_TASK_NAMES["mad/selective_copy"]
# A seed solves a MAD setting when its best grid point reaches this macro accuracy (the claims' solved_at).
SOLVED_AT = 0.99
# The paper's claims about its MAD table beyond the values themselves (checked by analysis.claims, which adds
# one claim per value of REFERENCE: the score within MAD_TOLERANCE of it; the tolerance is ours).
MAD_TOLERANCE = 0.03
MAD_CLAIMS: tuple[dict[str, Any], ...] = (
    {"text": "On the MAD average, the dynamic conv beats the static conv.",
     "difference": ["dynamic_conv_qkv", "static_conv_qkv"], "op": ">", "where": {"task": AVERAGE}},
    {"text": "On the MAD average, the static conv beats the plain transformer.",
     "difference": ["static_conv_qkv", "transformer"], "op": ">", "where": {"task": AVERAGE}},
    {"text": "The dynamic conv adds 0.113 to the transformer's MAD average.",
     "difference": ["dynamic_conv_qkv", "transformer"], "op": "=",
     "value": round(REFERENCE["dynamic_conv_qkv"][AVERAGE] - REFERENCE["transformer"][AVERAGE], 3),
     "tolerance": MAD_TOLERANCE, "where": {"task": AVERAGE}},
    {"text": "On fuzzy recall, its largest gain, the dynamic conv beats the static conv.",
     "difference": ["dynamic_conv_qkv", "static_conv_qkv"], "op": ">", "where": {"task": "Fuzzy Recall"}},
)


@dataclasses.dataclass
class Table:
    headers: list[str]
    rows: list[list[Any]]

    def markdown(self) -> str:
        cells = [[_cell(v) for v in row] for row in self.rows]
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(self.headers)]
        lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(self.headers, widths)) + " |",
                 "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
        return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows (dicts) as CSV, columns in first-appearance order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def fmt_stats(stats: Stats) -> str:
    """``0.942 [0.010]``: median [IQR]."""
    return "—" if stats.n == 0 else f"{stats.median:.3f} [{stats.iqr:.3f}]"


def _fmt3(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def fmt_diff(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:+.3f}"


def partial_cell(cell: str, scored: bool, done: int, total: int) -> str:
    """The cell of a group only ``done`` of whose ``total`` planned runs have readable records: its value marked
    partial, or only the count when nothing of it could be scored."""
    return f"{cell} (partial {done}/{total})" if scored else f"partial {done}/{total}"


@dataclasses.dataclass
class MadEntry:
    """One model's MAD results: column label, scores, reference values (or None), profile, missing runs, and
    (records, planned runs) per (task name, setting) (``SweepData.run_counts``)."""

    label: str
    scores: MadScores
    reference: dict[str, float] | None
    profile: str
    profile_text: str
    missing: int
    setting_counts: dict[tuple[str, str], tuple[int, int]] = dataclasses.field(default_factory=dict)


def reference_name(data: SweepData) -> str | None:
    """The REFERENCE key whose preset fields equal the folder's model (before profile overrides), if any."""
    spec = data.spec
    fields = spec.get("model_fields")
    for name in REFERENCE:
        if fields is not None and fields == models.PRESETS.get(name):
            return name
    return data.label if data.label in REFERENCE else None


def mad_entry(data: SweepData) -> MadEntry:
    if data.kind != "mad":
        raise ValueError(f"{str(data.path)!r} is not a MAD sweep (its manifest says {data.kind!r})")
    ref = reference_name(data)
    profile = data.spec.get("profile", {}).get("name", "?")
    scores = mad_scores(data.rows, data.metric, data.planned)
    planned_seeds = data.spec.get("seeds")
    seeds = len(planned_seeds) if planned_seeds else (scores.summary[AVERAGE].n if AVERAGE in scores.summary else 0)
    setting_counts = {(MAD_TASK_NAMES.get(task, task), setting): counts
                      for (task, setting), counts in data.run_counts(("task", "setting")).items()}
    return MadEntry(label=f"{data.label} ({profile}, n={seeds})", scores=scores,
                    reference=REFERENCE.get(ref) if ref else None, profile=profile,
                    profile_text=data.spec.get("profile_text", ""), missing=data.missing,
                    setting_counts=setting_counts)


def mad_table(entries: Sequence[MadEntry]) -> Table:
    """Rows: the six tasks (reference order) and the average; per model: median [IQR], ref, diff."""
    headers = ["Task"]
    for entry in entries:
        headers += [entry.label, "ref", "diff"]
    rows = []
    for task in MAD_ROWS:
        rows.append([task, *(cell for entry in entries for cell in _mad_cells(entry, task))])
        if task == SELECTIVE_COPY:  # beside it, the variant mad-lab generated before commit 35772e8
            rows.append([COPY16, *(cell for entry in entries
                                   for cell in _mad_cells(entry, task, Stats.of(entry.scores.copy16.values())))])
    return Table(headers, rows)


def _mad_cells(entry: MadEntry, task: str, stats: Stats | None = None) -> list[str]:
    """[median [IQR], ref, diff] of one task row and model; ``stats`` replace the task's own (a variant's)."""
    stats = entry.scores.summary.get(task, Stats.of([])) if stats is None else stats
    ref = entry.reference.get(task, math.nan) if entry.reference else math.nan
    cell = fmt_stats(stats)
    if task in entry.scores.coverage:  # some seed not scored: say how far the task got
        cell = partial_cell(cell, bool(stats.n), *entry.scores.coverage[task])
    elif task == AVERAGE and entry.scores.coverage and not stats.n:
        cell = "— (tasks partial)"
    return [cell, "—" if math.isnan(ref) else f"{ref:.3f}", fmt_diff(stats.median - ref)]


def mad_text(entries: Sequence[MadEntry]) -> str:
    """What ``mixlab mad table`` prints: each folder's profile, missing runs, the table and how to read it."""
    lines = []
    for entry in entries:
        lines.append(f"{entry.label}: {entry.profile_text}".rstrip(": "))
        if entry.missing:
            lines.append(f"  warning: {entry.missing} planned runs have no record yet; a task is scored only for "
                         f"the seeds whose runs of it are all finished")
    lines += ["", mad_table(entries).markdown(), "",
              "cells: median [IQR] over seeds of the task score (best macro accuracy of the lr x wd grid per "
              "setting, at the lowest-perplexity epoch, averaged over the task's settings); ref: the "
              "dynamic-conv paper (one seed, full protocol); diff = median - ref. A task is scored for a seed "
              "only when all its runs of that seed have records; 'partial k/n' counts its records, and the "
              "Average needs every task."]
    return "\n".join(lines)


def mad_task_rows(entries: Sequence[MadEntry]) -> list[dict[str, Any]]:
    """Long form for CSV: model, task, median, q25, q75, iqr, n, reference, diff."""
    rows = []
    for entry in entries:
        for task in MAD_ROWS:
            named = [(task, entry.scores.summary.get(task, Stats.of([])))]
            if task == SELECTIVE_COPY:
                named.append((COPY16, Stats.of(entry.scores.copy16.values())))
            ref = entry.reference.get(task, math.nan) if entry.reference else math.nan
            rows += [{"model": entry.label, "task": name, **stats.as_dict(), "reference": ref,
                      "diff": stats.median - ref} for name, stats in named]
    return rows


def mad_references(entries: Sequence[MadEntry]) -> dict[str, dict[str, float]]:
    """Reference values by model label, for the models that have them (what the bars mark)."""
    return {e.label: e.reference for e in entries if e.reference}


def mad_seed_rows(entries: Sequence[MadEntry]) -> list[dict[str, Any]]:
    """Long form of every (model, task, seed) score: what the per-task bars plot."""
    return [{"model": entry.label, "task": task, "seed": seed, "score": score}
            for entry in entries for task, scores in entry.scores.per_seed.items()
            for seed, score in scores.items()]


def mad_setting_rows(entries: Sequence[MadEntry], metric: str = "acc_macro") -> list[dict[str, Any]]:
    """Long form of the best grid point per (model, task, setting, seed)."""
    return [{"model": entry.label, "task": MAD_TASK_NAMES.get(r["task"], r["task"]), "setting": r["setting"],
             "seed": r["seed"], "score": r[metric], "lr": r["lr"], "weight_decay": r["weight_decay"],
             "best_epoch": r["best_epoch"], "at_end": r["at_end"], "hash": r["hash"]}
            for entry in entries for r in entry.scores.per_setting]


def mad_setting_table(entries: Sequence[MadEntry]) -> Table:
    """Median over seeds of each setting's best score, one column per model; a setting some but not all of whose
    planned runs have records is marked partial."""
    cells: dict[tuple[str, str], dict[str, list[float]]] = {}
    for row in mad_setting_rows(entries):
        cells.setdefault((row["task"], row["setting"]), {}).setdefault(row["model"], []).append(row["score"])
    order = {name: i for i, name in enumerate(MAD_ROWS)}
    keys = sorted(cells, key=lambda k: order.get(k[0], len(order)))
    rows = [[task, setting, *(_setting_cell(e, key, cells[key].get(e.label, [])) for e in entries)]
            for key in keys for task, setting in [key]]
    return Table(["Task", "Setting", *(e.label for e in entries)], rows)


def _setting_cell(entry: MadEntry, key: tuple[str, str], scores: list[float]) -> str:
    cell = _fmt3(Stats.of(scores).median)
    done, total = entry.setting_counts.get(key, (0, 0))
    return partial_cell(cell, True, done, total) if 0 < done < total else cell


def mad_budget_table(entries: Sequence[MadEntry]) -> Table:
    """Per task and model: how many of its scored runs (the best grid point of each setting and seed) were
    still improving when their budget ended (``at_end``: best evaluation the last, no early stop), k/n."""
    counts: dict[tuple[str, str], list[bool]] = {}
    for row in mad_setting_rows(entries):
        counts.setdefault((row["task"], row["model"]), []).append(bool(row["at_end"]))
    rows = []
    for task in MAD_ROWS[:-1]:  # the six tasks, not the average
        cells = [counts.get((task, e.label)) for e in entries]
        rows.append([task, *("—" if not c else f"{sum(c)}/{len(c)}" for c in cells)])
    return Table(["Task", *(e.label for e in entries)], rows)


def mad_solved_table(entries: Sequence[MadEntry], level: float = SOLVED_AT) -> Table | None:
    """The settings some model solves on some seeds but not on others (best grid point >= ``level``): per model
    the seeds that solve it, k/n ("—" without scored seeds). None when no setting splits so: where a setting is
    bimodal (a run forms the circuit or stays at a plateau), the median hides the share that solves it."""
    seeds: dict[tuple[str, str], dict[str, list[bool]]] = {}
    for row in mad_setting_rows(entries):
        seeds.setdefault((row["task"], row["setting"]), {}).setdefault(row["model"], []).append(row["score"] >= level)
    order = {name: i for i, name in enumerate(MAD_ROWS)}
    split = sorted((key for key, by_model in seeds.items() if any(0 < sum(v) < len(v) for v in by_model.values())),
                   key=lambda k: order.get(k[0], len(order)))
    if not split:
        return None
    rows = [[task, setting, *("—" if not (v := seeds[(task, setting)].get(e.label)) else f"{sum(v)}/{len(v)}"
                              for e in entries)] for task, setting in split]
    return Table(["Task", "Setting", *(e.label for e in entries)], rows)


def grid_table(data: SweepData) -> tuple[Table, list[dict[str, Any]]]:
    """A grid sweep's summary (best training point per seed, then over seeds) as a table and CSV rows: the
    metric's median [IQR], each score group's median (e.g. acc_present / acc_absent), how many seeds' best
    runs were still improving when training ended, and the paper's value for that (task, model) when the
    sweep's spec gives a reference (``runners.sweep.spec`` ``reference``). A cell some planned run of which has no
    readable record reads ``(partial k/n)`` (k records of its n runs), and then every CSV row gets ``records`` and
    ``planned``."""
    summary = grid_summary(data)
    counts = data.run_counts(GRID_CELL)
    partial = {key: c for key, c in counts.items() if c[0] < c[1]}
    groups = sorted({k[: -len("_median")] for r in summary for k in r if k.endswith("_median")})
    papers = {(v["task"], v["model"]): v for v in data.spec.get("reference", {}).get("values", [])}
    headers = ["task", "setting", "model", "model point", f"{data.metric} median [IQR]", "n",
               *(f"{g} median" for g in groups), "best training", "still improving"]
    if papers:
        headers += ["paper", "diff"]
    rows = []
    for r in summary:
        key = tuple(r[k] for k in GRID_CELL)
        cell = fmt_stats(Stats(r["median"], r["q25"], r["q75"], r["n"]))
        if key in partial:  # a planned run of the cell has no readable record: its best point may not be
            cell = partial_cell(cell, bool(r["n"]), *partial[key])
        if partial:
            r["records"], r["planned"] = counts.get(key, (None, None))
        row = [r["task"], r["setting"], r["model"], r["model_grid"], cell, r["n"],
               *(_fmt3(r.get(f"{g}_median", math.nan)) for g in groups), r["best_train"], f"{r['at_end']}/{r['n']}"]
        if papers:
            paper = papers.get((r["task"], r["model"]), {})
            value = paper.get("value", math.nan)
            r["paper"] = value if paper.get("value") is not None else math.nan
            r["paper_note"] = paper.get("note", "")
            row += [paper.get("note") or _fmt3(r["paper"]), fmt_diff(r["median"] - r["paper"])]
        rows.append(row)
    return Table(headers, rows), summary


def runs_table(data: SweepData) -> tuple[Table, list[dict[str, Any]]]:
    """Single runs (``mixlab run`` records), one row each: the record's name, task, setting (the task parameters
    it changed), model, width, training settings and the metrics of its lowest-perplexity evaluation, score
    groups included; as a table and CSV rows."""
    groups = sorted({k for r in data.rows for k in r if k.startswith("acc_") and k not in METRIC_KEYS})
    columns = ("task", "setting", "model", "d_model", "lr", "weight_decay", "seed", "data_seed", "steps",
               "best_epoch", "acc_micro", "acc_macro", "test_ppl", *groups)
    rows = [{"run": r["hash"], **{k: r.get(k, math.nan) for k in columns}} for r in data.rows]
    return Table(list(rows[0]), [list(row.values()) for row in rows]), rows
