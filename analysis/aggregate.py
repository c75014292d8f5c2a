"""Read a sweep folder's records and reduce them: best of a grid per seed, median / IQR / n over seeds, MAD.

A sweep folder (``runners.manifest``) holds ``sweep.json`` (the manifest: every planned run's hash, config and
labels) and ``runs/<hash>.json`` (one record per finished run). Each record becomes one flat row::

    {"hash", "task", "setting", "model", "model_grid", "train_grid", "seed",   # labels (strings / int)
     "lr", "weight_decay", "d_model", "init_seed", "data_seed",                # from the config
     "acc_macro", "acc_micro", "test_ppl", "test_loss", "best_epoch", "steps", "n_params",
     "at_end"}                                                                 # bool, see run_rows

Labels come from the manifest; a record it does not list (or a folder without one) gets labels derived from
its config: the MAD setting it matches (or its task parameters that differ from the defaults), the mixer (with
its qkv conv), d_model, lr and weight decay, and init_seed.

Metrics are those of the evaluation with the lowest test perplexity (mad-lab's rule; ``runners.record`` stores
it as ``final``); they are recomputed from the record's history with the same rule, first minimum on ties.

MAD score (docs/mad.md), per seed: best macro accuracy over the lr x wd grid for each setting, mean over each
task's settings, mean over the six tasks; then the median, IQR and count over seeds of each task mean and of
the average. With the sweep's manifest (``SweepData.planned``), a task is scored for a seed only once every
run of that task and seed has its record, and the average only for seeds whose every task is scored: a partial
task's mean over the settings that happen to be finished (the cheap ones first) would not compare with other
models or the paper. ``MadScores.coverage`` counts the records of each task that is not scored for every seed.
Without a manifest a seed is scored on what it has.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from mixlab import tasks
from mixlab.tasks.mad import mad_sweep_settings

MANIFEST = "sweep.json"
RUNS = "runs"
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


@dataclasses.dataclass
class SweepData:
    """One sweep folder: its manifest (None if absent), its records and their rows."""

    path: Path
    manifest: dict[str, Any] | None
    records: list[dict[str, Any]]
    rows: list[dict[str, Any]]

    @property
    def kind(self) -> str:
        """``mad`` or ``grid`` (a folder without a manifest is ``mad`` when every run is a MAD task)."""
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
        return (self.manifest or {}).get("name", self.path.name)

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
        """Runs the manifest lists that have no record yet (0 without a manifest)."""
        have = {r["name"] for r in self.records}
        return sum(1 for r in (self.manifest or {}).get("runs", []) if r["hash"] not in have)


def load_sweep(path: str | Path) -> SweepData:
    """Read a sweep folder; ValueError if it holds no records."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"no sweep folder {str(folder)!r}")
    manifest = None
    if (folder / MANIFEST).is_file():
        manifest = json.loads((folder / MANIFEST).read_text())
    records = load_records(folder)
    if not records:
        raise ValueError(f"{str(folder)!r} holds no run records (expected {RUNS}/<hash>.json)")
    # The manifest's order (seed, task, setting, model, ...) rather than the hashes' alphabetical one.
    order = {r["hash"]: i for i, r in enumerate((manifest or {}).get("runs", []))}
    records.sort(key=lambda r: order.get(r["name"], len(order)))
    return SweepData(folder, manifest, records, run_rows(records, manifest))


def load_records(folder: str | Path) -> list[dict[str, Any]]:
    """Every complete record under ``<folder>/runs`` (temporary files of runs in flight are skipped)."""
    records = []
    for path in sorted((Path(folder) / RUNS).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "config" in record and ("final" in record or record.get("history")):
            record.setdefault("name", path.stem)
            records.append(record)
    return records


def selected_metrics(record: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation with the lowest test perplexity (the first on ties); ``final`` without a history."""
    history = record.get("history") or []
    if history:
        return min(history, key=lambda h: h["test_ppl"])
    return dict(record["final"])


def run_rows(records: Sequence[Mapping[str, Any]], manifest: Mapping[str, Any] | None = None
             ) -> list[dict[str, Any]]:
    """One flat row per record (module docstring), labelled from the manifest where it lists the run.

    ``at_end``: the run's chosen evaluation (lowest perplexity) is its last and it did not stop early: its
    training budget ran out while its test perplexity was still falling (a longer run could change it).
    """
    metas = {r["hash"]: r["meta"] for r in (manifest or {}).get("runs", [])}
    rows = []
    for record in records:
        config = record["config"]
        meta = metas.get(record["name"]) or derived_meta(config)
        train = config["train"]
        chosen = selected_metrics(record)
        history = record.get("history") or []
        at_end = bool(history) and chosen is history[-1] and not record.get("stopped_early", False)
        row = {"hash": record["name"], "task": meta["task"], "setting": meta["setting"],
               "model": meta["model"], "model_grid": point_label(meta.get("model_grid", {})),
               "train_grid": point_label(meta.get("train_grid", {})), "seed": meta["seed"],
               "lr": train["lr"], "weight_decay": train["weight_decay"],
               "d_model": config["model"].get("d_model"), "init_seed": train["init_seed"],
               "data_seed": train["data_seed"], "best_epoch": chosen.get("epoch"),
               "steps": record.get("steps"), "n_params": record.get("n_params"), "at_end": at_end}
        row.update({k: chosen.get(k, math.nan) for k in METRIC_KEYS})
        # score groups of the task (e.g. acc_present / acc_absent of packed associative retrieval)
        row.update({k: v for k, v in chosen.items() if k.startswith("acc_") and k not in METRIC_KEYS})
        rows.append(row)
    return rows


def point_label(point: Mapping[str, Any]) -> str:
    """``{"d_model": 32}`` -> ``"d_model=32"``; the empty point -> ``"default"`` (as runners.sweep_spec labels)."""
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
    IQR and n over seeds, with the training point chosen most often and ``at_end``, how many of those best
    runs were still improving when training ended (``run_rows``)."""
    keys = ("task", "setting", "model", "model_grid")
    best = best_of_grid(data.rows, (*keys, "seed"), data.metric)
    groups = sorted({k for b in best for k in b if k.startswith("acc_") and k not in METRIC_KEYS})
    out = []
    for row in summarize(best, keys, data.metric):
        mine = [b for b in best if all(b[k] == row[k] for k in keys)]
        chosen = [b["train_grid"] for b in mine]
        row["best_train"] = max(set(chosen), key=chosen.count)
        row["at_end"] = sum(bool(b.get("at_end")) for b in mine)
        for group in groups:  # median over seeds of the best point's accuracy on each score group
            row[f"{group}_median"] = Stats.of(b.get(group, math.nan) for b in mine).median
        out.append(row)
    return out


@dataclasses.dataclass
class MadScores:
    """MAD scores of one model.

    per_setting: best-of-grid rows, one per (task, setting, seed).
    per_seed: {task name or "Average": {seed: score}}, complete (task, seed) pairs only (module docstring).
    summary: {task name or "Average": Stats over seeds}.
    coverage: {task name: (records, planned runs)} for each task some planned seed of which is incomplete.
    """

    per_setting: list[dict[str, Any]]
    per_seed: dict[str, dict[int, float]]
    summary: dict[str, Stats]
    coverage: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)


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
    return MadScores(per_setting=best, per_seed=per_seed, summary=summary, coverage=coverage)


def _task_seed_order(item: tuple[tuple[str, int], Any]) -> tuple[int, str, int]:
    (task, seed), _ = item
    order = list(MAD_TASK_NAMES)
    return (order.index(task) if task in order else len(order), task, seed)
