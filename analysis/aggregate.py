"""Read a folder's run records and reduce them: best of a grid per seed, median / IQR / n over seeds, MAD.

A sweep folder (``core.records``) holds ``sweep.json`` (the manifest: every planned run's hash, config and
labels) and ``runs/<hash>.json`` (one record per finished run); a folder of single runs holds the
``<name>.json`` records that ``mixlab run --out`` writes (``runners.train.record``). Each record becomes one flat row::

    {"hash", "task", "setting", "model", "model_grid", "train_grid", "seed",   # labels (strings / int)
     "lr", "weight_decay", "d_model", "init_seed", "data_seed",                # from the config
     "acc_macro", "acc_micro", "test_ppl", "test_loss", "best_epoch", "steps", "n_params",
     "at_end", "stopped_early", "train_loss_fall",                             # see run_row
     "num_test", "task_params"}                                                # the config's

Labels come from the manifest; a record it does not list (or a folder without one) gets labels derived from
its config: the MAD setting it matches (or its task parameters that differ from the defaults), the mixer (with
its qkv conv), d_model, lr and weight decay, and init_seed.

A file where a record should be that does not parse or lacks what a row needs is not skipped in silence: it
is kept as ``Unreadable`` (path and reason), and its run counts as missing, so the cells it belongs to read as
partial (``SweepData.run_counts``).

Metrics are those of the evaluation with the lowest test perplexity (mad-lab's rule; ``runners.train.record`` stores
it as ``final``); they are recomputed from the record's history with the same rule, first minimum on ties. The
other rule of ``EPOCH_RULES``, the run's last evaluation, gives the rows ``SweepData.rows_at`` returns for it: the
MAD report prints the table under both (docs/mad.md).

MAD score (docs/mad.md), per seed: best macro accuracy over the lr x wd grid for each setting, mean over each
task's settings, mean over the six tasks; then the median, IQR and count over seeds of each task mean and of
the average (and of the average with selective copy's 16-copied variant in place of its own score). With the
sweep's manifest (``SweepData.planned``), a task is scored for a seed only once every run of that task and seed
has its record, and the average only for seeds whose every task is scored: a partial task's mean over the
settings that happen to be finished (the cheap ones first) would not compare with other models or the paper.
``MadScores.coverage`` counts the records of each task that is not scored for every seed. Without a manifest a
seed is scored on what it has.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import lzma
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from mixlab import tasks
from mixlab.core.records import ARCHIVE, MANIFEST, RUNS, archived_records, record_files
from mixlab.tasks.mad import mad_sweep_settings

METRIC_KEYS = ("acc_macro", "acc_micro", "test_ppl", "test_loss")
# The six MAD tasks in the reference table's (alphabetical) order, with its names.
MAD_TASK_NAMES = {
    "mad/compression": "Compress",
    "mad/fuzzy_recall": "Fuzzy Recall",
    "mad/in_context_recall": "In-Context Recall",
    "mad/memorization": "Memorize",
    "mad/noisy_recall": "Noisy Recall",
    "mad/selective_copy": "Selective Copy",
}
AVERAGE = "Average"
# Selective copy as mad-lab generated it before its commit 35772e8 (2024-12-09): num_tokens_to_copy never reached
# the generator, so the settings num_tokens_to_copy=32, 64 and 96 copied 16 tokens, the baseline's data byte for
# byte (docs/mad.md). That variant's score needs no runs of its own: those settings take the baseline's score.
COPY16 = "Selective Copy, 16 copied"
COPY16_AVERAGE = "Average, 16 copied"
# Which evaluation of a run's history gives its metrics: mad-lab's (the lowest test perplexity: the best
# checkpoint, which its trainer.validate loads), or the run's last evaluation (the stop, or the budget's end).
LOWEST_PPL, LAST_EVAL = "lowest test perplexity", "last evaluation"
EPOCH_RULES = (LOWEST_PPL, LAST_EVAL)
# The task parameters a length figure puts on its x axis, in order of preference (plots.accuracy_vs_length).
LENGTH_PARAMS = ("seq_len", "num_kv_pairs")
# the labels of one cell of a grid sweep's summary: its best training point per seed, then over seeds
GRID_CELL = ("task", "setting", "model", "model_grid")
# A seed solves a cell (a grid's, or a MAD setting) when its best training point reaches this accuracy (the
# claims' usual solved_at): the tables count such seeds where a cell's seeds split.
SOLVED_AT = 0.99


@dataclasses.dataclass(frozen=True)
class Stats:
    """Median, quartiles, IQR and count of a sample (NaN statistics for an empty one)."""

    median: float
    q25: float
    q75: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q75 - self.q25

    @classmethod
    def of(cls, values: Iterable[float]) -> Stats:
        data = np.asarray([float(v) for v in values], dtype=np.float64)
        if data.size == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        q25, median, q75 = np.percentile(data, [25, 50, 75])
        return cls(float(median), float(q25), float(q75), int(data.size))

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "q25": self.q25, "q75": self.q75, "iqr": self.iqr, "n": self.n}


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """A file where a run record should be that cannot be used, and why (one line)."""

    path: Path
    reason: str


@dataclasses.dataclass
class SweepData:
    """One folder of run records: a sweep (its manifest, None if absent) or, ``single``, the records of single
    runs (``mixlab run --out``); its records, their rows, and the files that could not be read."""

    path: Path
    manifest: dict[str, Any] | None
    records: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    unreadable: list[Unreadable] = dataclasses.field(default_factory=list)
    single: bool = False

    @property
    def kind(self) -> str:
        """``mad``, ``grid`` or ``runs`` (single runs); a sweep without a manifest is ``mad`` when every run is a
        MAD task."""
        if self.single:
            return "runs"
        if self.manifest is not None:
            return self.manifest.get("kind", "grid")
        if self.rows and all(r["task"] in MAD_TASK_NAMES for r in self.rows):
            return "mad"
        return "grid"

    @property
    def spec(self) -> dict[str, Any]:
        return (self.manifest or {}).get("spec", {})

    @property
    def name(self) -> str:
        return (self.manifest or {}).get("name", self.path.name or self.path.resolve().name)

    @property
    def label(self) -> str:
        """The model of a MAD folder (its manifest's), else the folder name."""
        return self.spec.get("model", self.path.name)

    @property
    def metric(self) -> str:
        return self.spec.get("metric", "acc_macro" if self.kind == "mad" else "acc_micro")

    @property
    def planned(self) -> dict[tuple[str, int], set[str]] | None:
        """The manifest's run hashes per (task, seed), or None without a manifest."""
        if self.manifest is None:
            return None
        out: dict[tuple[str, int], set[str]] = {}
        for run in self.manifest.get("runs", []):
            out.setdefault((run["meta"]["task"], run["meta"]["seed"]), set()).add(run["hash"])
        return out

    @property
    def missing(self) -> int:
        """Runs the manifest lists that have no readable record yet (0 without a manifest)."""
        have = {r["name"] for r in self.records}
        return sum(1 for r in (self.manifest or {}).get("runs", []) if r["hash"] not in have)

    def run_counts(self, keys: Sequence[str]) -> dict[tuple, tuple[int, int]]:
        """(readable records, planned runs) per group of the manifest's runs by the labels ``keys`` (spelled as
        in the rows), in the manifest's order; {} without a manifest. A group with fewer records is partial."""
        have = {r["hash"] for r in self.rows}
        found: dict[tuple, list[bool]] = {}
        for run in (self.manifest or {}).get("runs", []):
            labels = row_labels(run["meta"])
            found.setdefault(tuple(labels[k] for k in keys), []).append(run["hash"] in have)
        return {key: (sum(runs), len(runs)) for key, runs in found.items()}

    def rows_at(self, rule: str) -> list[dict[str, Any]]:
        """The rows with the metrics of the evaluation ``rule`` (of EPOCH_RULES) picks in each record."""
        return self.rows if rule == LOWEST_PPL else run_rows(self.records, self.manifest, rule)

    def run_labels(self, name: str) -> dict[str, Any] | None:
        """The manifest's labels of the run whose record is ``<name>.json`` (``row_labels``), None if unlisted."""
        meta = _manifest_metas(self.manifest).get(name)
        return None if meta is None else row_labels(meta)


def load_sweep(path: str | Path) -> SweepData:
    """Read a sweep folder; ValueError if it holds no readable records."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"no sweep folder {str(folder)!r}")
    manifest = None
    if (folder / MANIFEST).is_file():
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except ValueError as exc:
            raise ValueError(f"{str(folder / MANIFEST)!r} is not a readable manifest ({exc})") from None
    paths = record_files(folder / RUNS)
    try:
        archived = archived_records(folder / RUNS)
    except (ValueError, lzma.LZMAError) as exc:  # an OSError names its own file: the archive, or runs/ itself
        raise ValueError(f"{str(folder / RUNS / ARCHIVE)!r} cannot be read ({exc})") from None
    # a record both archived and as a file (trained again after the archive was made) is read from the file
    files = {p.stem for p in paths}
    packed = [text for name, text in sorted(archived.items()) if name not in files]
    return _load(folder, paths, manifest, f"expected {RUNS}/<hash>.json", archived=packed)


def load_runs(path: str | Path) -> SweepData:
    """Read a folder of single runs: its ``*.json`` records as ``mixlab run --out`` writes them; ValueError if it
    holds no readable records."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"no folder {str(folder)!r}")
    return _load(folder, record_files(folder), None, "expected the <name>.json records of mixlab run",
                 single=True)


def _load(folder: Path, paths: Iterable[Path], manifest: dict[str, Any] | None, expected: str, *,
          single: bool = False, archived: Sequence[str] = ()) -> SweepData:
    records, rows, unreadable = read_runs(paths, manifest)
    metas = _manifest_metas(manifest)
    for text in archived:  # checked when they were archived (core.records.archive_records)
        record = json.loads(text)
        records.append(record)
        rows.append(run_row(record, metas.get(record["name"])))
    if not records:
        found = (f"; none of its {len(unreadable)} .json files could be read, the first "
                 f"{str(unreadable[0].path)!r}: {unreadable[0].reason}" if unreadable else "")
        raise ValueError(f"{str(folder)!r} holds no run records ({expected}){found}")
    # The manifest's order (seed, task, setting, model, ...) rather than the hashes' alphabetical one.
    order = {r["hash"]: i for i, r in enumerate((manifest or {}).get("runs", []))}
    pairs = sorted(zip(records, rows), key=lambda pair: order.get(pair[0]["name"], len(order)))
    return SweepData(folder, manifest, [record for record, _ in pairs], [row for _, row in pairs], unreadable,
                     single)


def read_runs(paths: Iterable[Path], manifest: Mapping[str, Any] | None = None
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Unreadable]]:
    """Each file's record and row (``run_row``, labelled from the manifest where it lists the run), or, for a
    file that is not a usable record, an ``Unreadable`` saying why. Records are written whole or not at all
    (``core.atomic``), so such a file is corrupt or foreign, not a run in flight (whose temporary file does
    not end in ``.json``)."""
    metas = _manifest_metas(manifest)
    records, rows, unreadable = [], [], []
    for path in paths:
        try:
            record = _read_record(path)
            rows.append(run_row(record, metas.get(record["name"])))
        except ValueError as exc:
            unreadable.append(Unreadable(path, str(exc)))
            continue
        records.append(record)
    return records, rows, unreadable


def _read_record(path: Path) -> dict[str, Any]:
    """The run record in ``path``; ValueError saying in a few words why it is not one."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if not text.strip():
        raise ValueError("empty file")
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(record, dict) or "config" not in record:
        raise ValueError("not a run record (no 'config')")
    if "final" not in record and not record.get("history"):
        raise ValueError("not a finished run's record (no 'final' metrics and no history)")
    record.setdefault("name", path.stem)
    return record


def _manifest_metas(manifest: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {r["hash"]: r["meta"] for r in (manifest or {}).get("runs", [])}


def selected_metrics(record: Mapping[str, Any], rule: str = LOWEST_PPL) -> dict[str, Any]:
    """The evaluation ``rule`` picks (EPOCH_RULES): the lowest test perplexity (the first on ties), or the last.
    Without a history: ``final`` (the lowest perplexity's), and for the last evaluation nothing (its metrics
    read NaN rather than another evaluation's)."""
    history = record.get("history") or []
    if rule not in EPOCH_RULES:
        raise ValueError(f"unknown epoch rule {rule!r}; known: {', '.join(EPOCH_RULES)}")
    if history:
        return history[-1] if rule == LAST_EVAL else min(history, key=lambda h: h["test_ppl"])
    return {} if rule == LAST_EVAL else dict(record["final"])


def run_rows(records: Sequence[Mapping[str, Any]], manifest: Mapping[str, Any] | None = None,
             rule: str = LOWEST_PPL) -> list[dict[str, Any]]:
    """One flat row per record (module docstring), labelled from the manifest where it lists the run, with the
    metrics of the evaluation ``rule`` picks."""
    metas = _manifest_metas(manifest)
    return [run_row(record, metas.get(record["name"]), rule) for record in records]


def run_row(record: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
            rule: str = LOWEST_PPL) -> dict[str, Any]:
    """A record's row (module docstring), labelled by ``meta`` (a manifest's), else by ``derived_meta``, with the
    metrics of the evaluation ``rule`` picks (``selected_metrics``); ValueError naming what the record lacks.

    ``at_end``: the run's lowest-perplexity evaluation is its last and it did not stop early: its training
    budget ran out while its test perplexity was still falling (a longer run could change it).
    ``stopped_early``: the run stopped at its early-stop threshold (``steps`` is then the step it got there).
    ``train_loss_fall``: the share of its first evaluation's training loss gone by its last, (first - last) /
    first; NaN with fewer than two evaluations (analysis.claims reads it to tell a run that did not train).
    """
    try:
        config = record["config"]
        train = config["train"]
        chosen = selected_metrics(record, rule)
        history = record.get("history") or []
        stopped = bool(record.get("stopped_early", False))
        at_end = bool(history) and selected_metrics(record) is history[-1] and not stopped
        # a single run's config holds only the fields it set; its resolved model has the rest
        d_model = config["model"].get("d_model", (record.get("resolved") or {}).get("model", {}).get("d_model"))
        row = {"hash": record["name"], **row_labels(meta or derived_meta(config)),
               "lr": train["lr"], "weight_decay": train["weight_decay"], "d_model": d_model,
               "init_seed": train["init_seed"], "data_seed": train["data_seed"], "best_epoch": chosen.get("epoch"),
               "steps": record.get("steps"), "n_params": record.get("n_params"), "at_end": at_end,
               "stopped_early": stopped, "train_loss_fall": _loss_fall(history), "num_test": train.get("num_test"),
               "task_params": dict(config["task_params"])}
    except KeyError as exc:
        raise ValueError(f"not a run record (no {exc.args[0]!r})") from None
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"not a run record ({exc})") from None
    row.update({k: chosen.get(k, math.nan) for k in METRIC_KEYS})
    # score groups of the task (e.g. acc_present / acc_absent of packed associative retrieval)
    row.update({k: v for k, v in chosen.items() if k.startswith("acc_") and k not in METRIC_KEYS})
    return row


def _loss_fall(history: Sequence[Mapping[str, Any]]) -> float:
    """(first - last) / first of the training loss over a run's evaluations; NaN with fewer than two (or no
    positive first loss)."""
    losses = [h.get("train_loss", math.nan) for h in history]
    if len(losses) < 2 or not losses[0] > 0:
        return math.nan
    return (losses[0] - losses[-1]) / losses[0]


def row_labels(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A run's labels (a manifest's ``meta`` or ``derived_meta``) as rows spell them: grid points as text."""
    return {"task": meta["task"], "setting": meta["setting"], "model": meta["model"],
            "model_grid": point_label(meta.get("model_grid", {})),
            "train_grid": point_label(meta.get("train_grid", {})), "seed": meta["seed"]}


def point_label(point: Mapping[str, Any]) -> str:
    """``{"d_model": 32}`` -> ``"d_model=32"``; the empty point -> ``"default"`` (as runners.sweep.spec labels)."""
    return " ".join(f"{k}={v}" for k, v in point.items()) or "default"


def derived_meta(config: Mapping[str, Any]) -> dict[str, Any]:
    """Labels for a run the manifest does not list, from its config alone."""
    task, params, train, model = config["task"], config["task_params"], config["train"], config["model"]
    setting = _mad_labels().get(_setting_key(task, params, train["num_train"]))
    if setting is None:
        defaults = tasks.TASKS[task].defaults() if task in tasks.TASKS else {}
        changed = {k: v for k, v in params.items() if json.dumps(defaults.get(k)) != json.dumps(v)}
        setting = point_label(changed)
    qkv = model.get("qkv_conv", "none")
    mixer = model.get("mixer", "attention")
    return {"task": task, "setting": setting, "model": mixer if qkv == "none" else f"{mixer}+qkv_{qkv}",
            "model_grid": {"d_model": model.get("d_model")},
            "train_grid": {"lr": train["lr"], "weight_decay": train["weight_decay"]},
            "seed": train["init_seed"]}


def _setting_key(task: str, params: Mapping[str, Any], num_train: int) -> str:
    return json.dumps([task, params, num_train], sort_keys=True)


@functools.cache
def _mad_labels() -> dict[str, str]:
    return {_setting_key(s.task, s.params, s.num_train): s.label for s in mad_sweep_settings()}


def group_by(rows: Iterable[Mapping[str, Any]], keys: Sequence[str]) -> dict[tuple, list[Mapping[str, Any]]]:
    """Rows grouped by the values of ``keys``, groups in order of first appearance."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


def varying_task_params(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The task parameters whose value differs between two rows of the same task, in first-appearance order."""
    varying: dict[str, None] = {}
    for group in group_by(rows, ("task",)).values():
        for name in dict.fromkeys(k for r in group for k in r["task_params"]):
            # JSON text: values may be lists (e.g. key_lengths), and a parameter a row lacks reads null
            if len({json.dumps(r["task_params"].get(name), sort_keys=True) for r in group}) > 1:
                varying[name] = None
    return list(varying)


def length_param(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The first of LENGTH_PARAMS that varies between runs of one task (``varying_task_params``), else None."""
    varying = varying_task_params(rows)
    return next((name for name in LENGTH_PARAMS if name in varying), None)


def best_of_grid(rows: Iterable[Mapping[str, Any]], keys: Sequence[str], metric: str) -> list[dict[str, Any]]:
    """Per group of ``keys`` the row with the highest ``metric`` (the first such on ties; NaN never wins)."""
    best = []
    for group in group_by(rows, keys).values():
        scored = [r for r in group if not math.isnan(r[metric])] or group
        best.append(dict(max(scored, key=lambda r: r[metric])))
    return best


def summarize(rows: Iterable[Mapping[str, Any]], keys: Sequence[str], metric: str) -> list[dict[str, Any]]:
    """Median / quartiles / IQR / n of ``metric`` per group of ``keys`` (one row per seed: over seeds)."""
    return [{**dict(zip(keys, key)), **Stats.of(r[metric] for r in group).as_dict()}
            for key, group in group_by(rows, keys).items()]


def grid_summary(data: SweepData) -> list[dict[str, Any]]:
    """For a grid sweep: best training point per (task, setting, model, model point, seed), then the median,
    IQR and n over seeds, with the training point chosen most often (ties: the first in sorted order) and
    ``at_end``, how many of those best runs were still improving when training ended (``run_row``), and
    ``solved``, how many reach SOLVED_AT. Cells in the
    manifest's order (those it does not plan after them); a cell it plans that has no readable record gets a row
    too, with n = 0."""
    keys = GRID_CELL
    best = best_of_grid(data.rows, (*keys, "seed"), data.metric)
    groups = sorted({k for b in best for k in b if k.startswith("acc_") and k not in METRIC_KEYS})
    out = []
    for row in summarize(best, keys, data.metric):
        mine = [b for b in best if all(b[k] == row[k] for k in keys)]
        chosen = [b["train_grid"] for b in mine]
        # the most frequent point; ties go to the first in sorted order, so the label never depends on set order
        row["best_train"] = max(sorted(set(chosen)), key=chosen.count)
        row["at_end"] = sum(bool(b.get("at_end")) for b in mine)
        row["solved"] = sum(b[data.metric] >= SOLVED_AT for b in mine)
        for group in groups:  # median over seeds of the best point's accuracy on each score group
            row[f"{group}_median"] = Stats.of(b.get(group, math.nan) for b in mine).median
        out.append(row)
    planned = list(data.run_counts(keys))
    scored = {tuple(row[k] for k in keys) for row in out}
    out += [{**dict(zip(keys, key)), **Stats.of([]).as_dict(), "best_train": "—", "at_end": 0, "solved": 0,
             **{f"{group}_median": math.nan for group in groups}}
            for key in planned if key not in scored]
    order = {key: i for i, key in enumerate(planned)}
    return sorted(out, key=lambda row: order.get(tuple(row[k] for k in keys), len(order)))


@dataclasses.dataclass
class MadScores:
    """MAD scores of one model.

    per_setting: best-of-grid rows, one per (task, setting, seed).
    per_seed: {task name or "Average": {seed: score}}, complete (task, seed) pairs only (module docstring).
    summary: {task name or "Average": Stats over seeds}.
    coverage: {task name: (records, planned runs)} for each task some planned seed of which is incomplete.
    copy16: {seed: score} of selective copy as mad-lab generated it before commit 35772e8 (``COPY16``), for
        the seeds whose selective copy score is complete; not part of the Average.
    copy16_average: {seed: the Average with ``copy16`` in selective copy's place} (``COPY16_AVERAGE``), for the
        seeds with both.
    """

    per_setting: list[dict[str, Any]]
    per_seed: dict[str, dict[int, float]]
    summary: dict[str, Stats]
    coverage: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    copy16: dict[int, float] = dataclasses.field(default_factory=dict)
    copy16_average: dict[int, float] = dataclasses.field(default_factory=dict)


def mad_scores(rows: Sequence[Mapping[str, Any]], metric: str = "acc_macro",
               planned: Mapping[tuple[str, int], set[str]] | None = None) -> MadScores:
    """Score MAD rows (module docstring); task names are MAD_TASK_NAMES' (reference-table) names.
    ``planned``: run hashes per (task, seed) (``SweepData.planned``); None scores each seed on what it has."""
    have = {r["hash"] for r in rows}
    complete = None if planned is None else {key for key, hashes in planned.items() if hashes <= have}
    best = best_of_grid(rows, ("task", "setting", "seed"), metric)
    per_seed: dict[str, dict[int, float]] = {}
    for (task, seed), group in sorted(group_by(best, ("task", "seed")).items(), key=_task_seed_order):
        if complete is None or (task, seed) in complete:
            per_seed.setdefault(MAD_TASK_NAMES.get(task, task), {})[seed] = float(np.mean([r[metric] for r in group]))
    coverage: dict[str, tuple[int, int]] = {}
    if planned is not None:
        for task in dict.fromkeys(task for task, _ in planned):
            keys = [key for key in planned if key[0] == task]
            if any(key not in complete for key in keys):
                total = sum(len(planned[key]) for key in keys)
                coverage[MAD_TASK_NAMES.get(task, task)] = (sum(len(planned[key] & have) for key in keys), total)
    seeds = sorted({seed for scores in per_seed.values() for seed in scores})
    # a fixed order (the reference table's, then by name): a float mean over a set's elements would change
    # with string hashing
    names = ({MAD_TASK_NAMES.get(task, task) for task, _ in planned} if planned is not None else set(per_seed))
    order = list(MAD_TASK_NAMES.values())
    tasks = sorted(names, key=lambda name: (order.index(name) if name in order else len(order), name))
    per_seed[AVERAGE] = {s: float(np.mean([per_seed[t][s] for t in tasks if s in per_seed.get(t, {})]))
                         for s in seeds
                         if planned is None or all(s in per_seed.get(t, {}) for t in tasks)}
    summary = {name: Stats.of(scores.values()) for name, scores in per_seed.items()}
    copy = MAD_TASK_NAMES["mad/selective_copy"]
    copy16 = copy16_scores(best, metric, per_seed.get(copy, {}))
    # the same tasks in the same order as the Average, selective copy's score swapped for its variant's
    copy16_average = {s: float(np.mean([copy16[s] if t == copy else per_seed[t][s]
                                        for t in tasks if s in per_seed.get(t, {})]))
                      for s in per_seed[AVERAGE] if s in copy16}
    return MadScores(per_setting=best, per_seed=per_seed, summary=summary, coverage=coverage, copy16=copy16,
                     copy16_average=copy16_average)


def copy16_scores(best: Sequence[Mapping[str, Any]], metric: str, seeds: Iterable[int]) -> dict[int, float]:
    """Selective copy's score per seed (of ``seeds``) with its num_tokens_to_copy settings scored as the baseline
    (``COPY16``): the mean over the same settings, in the same order, as the task score."""
    out = {}
    for seed in seeds:
        rows = [r for r in best if r["task"] == "mad/selective_copy" and r["seed"] == seed]
        base = [r[metric] for r in rows if r["setting"] == "baseline"]
        if len(base) == 1:
            out[seed] = float(np.mean([base[0] if r["setting"].startswith("num_tokens_to_copy=") else r[metric]
                                       for r in rows]))
    return out


def _task_seed_order(item: tuple[tuple[str, int], Any]) -> tuple[int, str, int]:
    (task, seed), _ = item
    order = list(MAD_TASK_NAMES)
    return (order.index(task) if task in order else len(order), task, seed)
