"""Markdown and CSV tables of sweep results, and the MAD table beside the dynamic-conv paper's values.

MAD cells read ``median [IQR]`` over seeds of the task score (module ``analysis.aggregate``), or the value alone
for one seed; ``ref`` is the dynamic-conv paper's value (docs/mad.md) for the models it reports, ``diff`` is median
minus ref. A model's column header gives its seed count (``n=3``) when every scored cell of its table has that
many seeds; otherwise each cell gives its own (``0.469, n=1``), so a cell of one seed is never read as three.
The same table at the other reported epoch (``aggregate.EPOCH_RULES``: the last evaluation instead of the lowest
test perplexity) goes beside it with the difference per cell (``mad_epoch_table``).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mixlab import models
from mixlab.analysis.aggregate import (
    AVERAGE,
    COPY16,
    COPY16_AVERAGE,
    GRID_CELL,
    LAST_EVAL,
    LOWEST_PPL,
    MAD_TASK_NAMES,
    METRIC_KEYS,
    SOLVED_AT,
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
# The rows of the MAD table: the six tasks and the average, each variant under the row it varies (whose reference
# value and coverage it shares): selective copy as mad-lab generated it before commit 35772e8, and the average
# with that variant in selective copy's place.
VARIANTS = {SELECTIVE_COPY: COPY16, AVERAGE: COPY16_AVERAGE}
# The report lists the cells (and settings) whose median the reported epoch moves by more than this.
EPOCH_MOVED = 0.01
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
    """``0.942 [0.010]``: median [IQR]; one value alone (``0.942``): one seed has no spread."""
    if stats.n == 0:
        return "—"
    return f"{stats.median:.3f}" if stats.n == 1 else f"{stats.median:.3f} [{stats.iqr:.3f}]"


def seeds_cell(cell: str, n: int, header_n: int | None) -> str:
    """``cell`` of ``n`` seeds in a column whose header gives ``header_n`` (None: none): its own n where the
    header's is not its."""
    return f"{cell}, n={n}" if n and n != header_n else cell


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
    """One model's MAD results: column label, scores, reference values (or None), profile, missing runs,
    (records, planned runs) per (task name, setting) (``SweepData.run_counts``), the scores at the last
    evaluation of every run (None: not read), and ``seeds``, the one seed count of its scored table cells
    (``table_seeds``; None when they differ), which its label gives."""

    label: str
    scores: MadScores
    reference: dict[str, float] | None
    profile: str
    profile_text: str
    missing: int
    setting_counts: dict[tuple[str, str], tuple[int, int]] = dataclasses.field(default_factory=dict)
    last: MadScores | None = None
    seeds: int | None = None


def table_stats(scores: MadScores) -> list[tuple[str, str, Stats]]:
    """Per row of the MAD table, in order: its name, the row whose reference and coverage it shares (itself, or
    the row a variant varies: ``VARIANTS``) and its statistics over seeds."""
    variants = {SELECTIVE_COPY: scores.copy16, AVERAGE: scores.copy16_average}
    rows = []
    for task in MAD_ROWS:
        rows.append((task, task, scores.summary.get(task, Stats.of([]))))
        if task in VARIANTS:
            rows.append((VARIANTS[task], task, Stats.of(variants[task].values())))
    return rows


def table_seeds(scores: MadScores, planned: int | None) -> int | None:
    """The seed count every scored cell of the MAD table shares; ``planned`` when no cell is scored; None when
    the cells differ (a task with its three seeds beside tasks with one so far)."""
    counts = {stats.n for _, _, stats in table_stats(scores) if stats.n}
    if not counts:
        return planned
    return counts.pop() if len(counts) == 1 else None


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
    seeds = table_seeds(scores, len(planned_seeds) if planned_seeds else None)
    setting_counts = {(MAD_TASK_NAMES.get(task, task), setting): counts
                      for (task, setting), counts in data.run_counts(("task", "setting")).items()}
    return MadEntry(label=f"{data.label} ({profile}" + (f", n={seeds})" if seeds else ")"), scores=scores,
                    reference=REFERENCE.get(ref) if ref else None, profile=profile,
                    profile_text=data.spec.get("profile_text", ""), missing=data.missing,
                    setting_counts=setting_counts,
                    last=mad_scores(data.rows_at(LAST_EVAL), data.metric, data.planned), seeds=seeds)


def mad_table(entries: Sequence[MadEntry]) -> Table:
    """Rows: the six tasks (reference order) and the average, each variant under the row it varies
    (``table_stats``); per model: median [IQR], ref, diff."""
    headers = ["Task"]
    for entry in entries:
        headers += [entry.label, "ref", "diff"]
    by_entry = [table_stats(entry.scores) for entry in entries]
    rows = []
    for i, (name, _, _) in enumerate(by_entry[0] if entries else []):
        row = [name]
        for entry, stats in zip(entries, by_entry, strict=True):
            _, task, cell = stats[i]
            row += _mad_cells(entry, task, cell)
        rows.append(row)
    return Table(headers, rows)


def _mad_cells(entry: MadEntry, task: str, stats: Stats) -> list[str]:
    """[median [IQR], ref, diff] of one model's cell of ``stats`` in the row of ``task`` or of its variant."""
    return [_score_cell(entry, task, stats), *_reference_cells(entry, task, stats)]


def _score_cell(entry: MadEntry, task: str, stats: Stats) -> str:
    """median [IQR] (one seed: the value), with its n where the column's header does not give it, and how far
    the task got where some seed is not scored."""
    cell = seeds_cell(fmt_stats(stats), stats.n, entry.seeds)
    if task in entry.scores.coverage:  # some seed not scored: say how far the task got
        cell = partial_cell(cell, bool(stats.n), *entry.scores.coverage[task])
    elif task == AVERAGE and entry.scores.coverage and not stats.n:
        cell = "— (tasks partial)"
    return cell


def _reference_cells(entry: MadEntry, task: str, stats: Stats) -> list[str]:
    ref = entry.reference.get(task, math.nan) if entry.reference else math.nan
    return ["—" if math.isnan(ref) else f"{ref:.3f}", fmt_diff(stats.median - ref)]


def mad_epoch_table(entries: Sequence[MadEntry]) -> Table:
    """The MAD table's cells at both reported epochs (``aggregate.EPOCH_RULES``): per model, the cell at the
    lowest test perplexity (the MAD table's), at the last evaluation, and the difference of their medians
    (last minus lowest). Models whose last evaluations were not read are left out."""
    entries = [e for e in entries if e.last is not None]
    headers = ["Task"]
    for entry in entries:
        headers += [f"{entry.label}: lowest ppl", "last eval", "moved"]
    pairs = [list(zip(table_stats(e.scores), table_stats(e.last), strict=True)) for e in entries]
    rows = []
    for i, ((name, task, _), _) in enumerate(pairs[0] if entries else []):
        row = [name]
        for entry, cells in zip(entries, pairs, strict=True):
            (_, _, lowest), (_, _, last) = cells[i]
            row += [_score_cell(entry, task, lowest), _score_cell(entry, task, last),
                    fmt_diff(last.median - lowest.median)]
        rows.append(row)
    return Table(headers, rows)


def mad_epoch_moves(entries: Sequence[MadEntry], threshold: float = EPOCH_MOVED) -> Table | None:
    """The cells of the MAD table whose median the reported epoch moves by more than ``threshold``: model, row,
    the median at the lowest perplexity, at the last evaluation, and the move; None when none moves so far."""
    rows = []
    for entry in (e for e in entries if e.last is not None):
        for (name, _, lowest), (_, _, last) in zip(table_stats(entry.scores), table_stats(entry.last), strict=True):
            if lowest.n and last.n and abs(last.median - lowest.median) > threshold:
                rows.append([entry.label, name, f"{lowest.median:.3f}", f"{last.median:.3f}",
                             fmt_diff(last.median - lowest.median)])
    return Table(["model", "row", "lowest ppl", "last eval", "moved"], rows) if rows else None


def mad_epoch_setting_moves(entries: Sequence[MadEntry], threshold: float = EPOCH_MOVED) -> Table | None:
    """The settings whose median over seeds of the best grid point the reported epoch moves by more than
    ``threshold``: model, task, setting (marked partial where some of its planned runs have no record), seeds,
    both medians and the move; None when none moves so far."""
    rows = []
    for entry in (e for e in entries if e.last is not None):
        lowest, last = _setting_scores(entry.scores), _setting_scores(entry.last)
        for key, values in lowest.items():
            a, b = Stats.of(values), Stats.of(last.get(key, []))
            if b.n and abs(b.median - a.median) > threshold:
                done, total = entry.setting_counts.get(key, (0, 0))
                setting = partial_cell(key[1], True, done, total) if 0 < done < total else key[1]
                rows.append([entry.label, key[0], setting, str(a.n), f"{a.median:.3f}", f"{b.median:.3f}",
                             fmt_diff(b.median - a.median)])
    order = {name: i for i, name in enumerate(MAD_ROWS)}
    rows.sort(key=lambda r: order.get(r[1], len(order)))  # stable: models in their order within a task
    headers = ["model", "task", "setting", "seeds", "lowest ppl", "last eval", "moved"]
    return Table(headers, rows) if rows else None


def _setting_scores(scores: MadScores, metric: str = "acc_macro") -> dict[tuple[str, str], list[float]]:
    """Per (task name, setting), the best grid point's score of each seed."""
    out: dict[tuple[str, str], list[float]] = {}
    for row in scores.per_setting:
        out.setdefault((MAD_TASK_NAMES.get(row["task"], row["task"]), row["setting"]), []).append(row[metric])
    return out


def mad_epoch_rows(entries: Sequence[MadEntry]) -> list[dict[str, Any]]:
    """Long form for CSV of the MAD table at both reported epochs: model, task, epoch rule, median, q25, q75,
    iqr, n."""
    return [{"model": entry.label, "task": name, "epoch": rule, **stats.as_dict()}
            for entry in entries if entry.last is not None
            for rule, scores in ((LOWEST_PPL, entry.scores), (LAST_EVAL, entry.last))
            for name, _, stats in table_stats(scores)]


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
              "setting, at the lowest-perplexity epoch, averaged over the task's settings), the value alone for "
              "one seed; n: the seeds of a column (its header) or of a cell (where the column's cells differ); "
              "ref: the dynamic-conv paper (one seed, full protocol); diff = median - ref. A task is scored for "
              "a seed only when all its runs of that seed have records; 'partial k/n' counts its records, and "
              "the Average needs every task. Selective copy is scored twice: as mixlab generates it "
              "(num_tokens_to_copy honoured) and '16 copied', as mad-lab generated it before its commit 35772e8 "
              "(the settings num_tokens_to_copy=32/64/96 copy 16 tokens, the baseline's data); each has its "
              "Average (docs/mad.md)."]
    return "\n".join(lines)


def mad_task_rows(entries: Sequence[MadEntry]) -> list[dict[str, Any]]:
    """Long form for CSV: model, task, median, q25, q75, iqr, n, reference, diff."""
    rows = []
    for entry in entries:
        for name, task, stats in table_stats(entry.scores):
            ref = entry.reference.get(task, math.nan) if entry.reference else math.nan
            rows.append({"model": entry.label, "task": name, **stats.as_dict(), "reference": ref,
                         "diff": stats.median - ref})
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
    cell = seeds_cell(_fmt3(Stats.of(scores).median), len(scores), entry.seeds)
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
    sweep's spec gives a reference (``runners.sweep.spec`` ``reference``). A cell whose seeds split, some at or
    above SOLVED_AT and some below, gives the share solved beside its median (``0.973 [0.491], 2/3 solved``): a
    median hides a bimodal outcome. A cell some planned run of which has no
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
        if 0 < r["solved"] < r["n"]:
            cell += f", {r['solved']}/{r['n']} solved"
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


def curve_rows(records: Iterable[Mapping[str, Any]], picks: Iterable[tuple[str, str, str]],
               metric: str) -> list[dict[str, Any]]:
    """The points of learning curves (``plots.learning_curves``): for each picked run (record name, panel, line),
    one row per evaluation of its history: panel, line, run (its name), step, ``metric`` and test_loss."""
    by_name = {record["name"]: record for record in records}
    return [{"panel": panel, "line": line, "run": name, "step": entry["step"],
             metric: entry.get(metric, math.nan), "test_loss": entry.get("test_loss", math.nan)}
            for name, panel, line in picks for entry in by_name[name].get("history") or []]
