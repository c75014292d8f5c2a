"""Sweep grid files: the YAML schema (``SweepSpec``), the packaged presets and the expansion of a grid into runs.

Grid files (YAML read with ``yaml.safe_load``; unknown keys at any level are errors)::

    name: mqar_varlen_fig2              # required; names the default output folder
    description: one line
    tasks:                              # every entry is crossed with everything below
      - task: mqar_varlen
        params: {seq_len: 256}          # task parameters over the task's defaults
        grid: {num_kv_pairs: [8, 16]}   # task parameters varied: a product of lists, or a list of points
        train: {num_train: 100000}      # training fields for this task only
    models:                             # label -> model fields; `preset: NAME` starts from models.PRESETS
      no_conv: {mixer: attention, n_layers: 1}
    model_grid: {d_model: [32, 64]}     # model fields varied for every model (product or list of points)
    train: {epochs: 8, lr: 1.0e-3}      # TrainConfig fields for every run
    train_grid: {lr: [3.0e-4, 1.0e-3]}  # TrainConfig fields varied; analysis keeps the best point per seed
    seeds: 5                            # a count (seeds 0..N-1) or a list
    vary_data_seed: true                # seed s sets init_seed = s and, if true, data_seed = s
    metric: acc_micro                   # the final metric that tables report and best-of-grid maximises

YAML 1.1 reads ``1e-3`` as text (write ``1.0e-3``); text that parses as a number is accepted where a field
is a float.

Each run's labels (``meta`` in the manifest) are task, setting (the task-grid point), model (its label),
model_grid, train_grid and seed; ``analysis.aggregate`` groups by them. Presets are the YAML files of
``runners/sweep/presets/``, loaded by name (``load_spec``).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from mixlab import models, tasks
from mixlab.analysis import claims
from mixlab.analysis.aggregate import METRIC_KEYS
from mixlab.core.fields import check, check_mapping, field_types, from_yaml
from mixlab.runners.sweep.plan import TASK_FIXED_MODEL_FIELDS, PlannedRun, Resolver, SweepPlan, parse_seeds
from mixlab.runners.train.config import TrainConfig

# TrainConfig fields the seeds set.
SEED_FIELDS = ("init_seed", "data_seed")
METRICS = ("acc_micro", "acc_macro")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskEntry:
    task: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    grid: tuple[dict[str, Any], ...] = ({},)
    train: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A grid: tasks (x task-parameter points) x models (x model-field points) x training points x seeds.

    Build it with ``SweepSpec.from_dict`` (checks every key) or ``load_spec`` (preset name or YAML path).
    """

    name: str
    description: str = ""
    tasks: tuple[TaskEntry, ...]
    models: dict[str, dict[str, Any]]
    model_grid: tuple[dict[str, Any], ...] = ({},)
    train: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_grid: tuple[dict[str, Any], ...] = ({},)
    seeds: tuple[int, ...] = (0,)
    vary_data_seed: bool = True
    metric: Literal[METRICS] = "acc_micro"
    reference: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> SweepSpec:
        """Parse and check a grid description (the YAML's top-level mapping); ValueError names what is bad."""
        annotations = field_types(cls)
        data = check_mapping("sweep", data, annotations, required={"name", "tasks", "models"})
        name = data["name"]
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"sweep name must be a plain non-empty string, got {name!r}")
        vary_data = check("vary_data_seed", data.get("vary_data_seed", True), annotations["vary_data_seed"])
        train_fields = set(field_types(TrainConfig)) - set(SEED_FIELDS)
        if not vary_data:
            train_fields.add("data_seed")
        model_fields = set(field_types(models.ModelConfig)) - set(TASK_FIXED_MODEL_FIELDS)

        entries = data["tasks"]
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"tasks must be a non-empty list, got {entries!r}")
        task_entries = []
        for i, entry in enumerate(entries):
            where = f"tasks[{i}]"
            entry = check_mapping(where, entry, {"task", "params", "grid", "train"}, required={"task"})
            try:
                params_cls = tasks.task_class(entry["task"]).Params
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            train = _section(f"{where}.train", entry.get("train", {}), TrainConfig, train_fields)
            params = _section(f"{where}.params", entry.get("params", {}), params_cls)
            grid = _grid(f"{where}.grid", entry.get("grid"), params_cls)
            task_entries.append(TaskEntry(task=entry["task"], params=params, grid=grid, train=train))

        variants = check_mapping("models", data["models"])
        if not variants:
            raise ValueError("models must name at least one model")
        resolved_models = {}
        for label, fields in variants.items():
            where = f"models.{label}"
            fields = check_mapping(where, fields if fields is not None else {})
            preset = fields.pop("preset", None)
            fields = _section(where, fields, models.ModelConfig, model_fields)
            if preset is not None:
                if preset not in models.PRESETS:
                    raise ValueError(f"models.{label}: unknown preset {preset!r}; "
                                     f"choose from {sorted(models.PRESETS)}")
                fields = {**models.PRESETS[preset], **fields}
            resolved_models[str(label)] = fields

        model_grid = _grid("model_grid", data.get("model_grid"), models.ModelConfig, model_fields)
        train = _section("train", data.get("train", {}), TrainConfig, train_fields)
        train_grid = _grid("train_grid", data.get("train_grid"), TrainConfig, train_fields)
        metric = check("metric", data.get("metric", "acc_micro"), annotations["metric"])
        reference = _reference(data.get("reference", {}), task_entries, list(resolved_models), model_grid)
        return cls(name=name, description=str(data.get("description", "")), tasks=tuple(task_entries),
                   models=resolved_models, model_grid=model_grid, train=train, train_grid=train_grid,
                   seeds=parse_seeds(data.get("seeds", 1)), vary_data_seed=vary_data, metric=metric,
                   reference=reference)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, saved in the manifest."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def plan(self, *, device: str | None = None, seeds: Sequence[int] | None = None) -> SweepPlan:
        """Expand into runs (resolved, with their labels); ``device`` and ``seeds`` override the spec's.

        Every run is resolved (and so checked) here, once, before anything trains.
        """
        seed_list = self.seeds if seeds is None else parse_seeds(list(seeds))
        spec = {**self.to_dict(), "seeds": list(seed_list), "device": device}
        resolver = Resolver()
        runs = []
        # Seeds outermost: a sweep stopped half-way holds whole grids for its first seeds.
        for seed in seed_list:
            for entry in self.tasks:
                points = itertools.product(entry.grid, self.models.items(), self.model_grid, self.train_grid)
                for task_point, (label, fields), model_point, train_point in points:
                    train = {**self.train, **entry.train, **train_point, "init_seed": seed}
                    if self.vary_data_seed:
                        train["data_seed"] = seed
                    if device is not None:
                        train["device"] = device
                    run = resolver.run(entry.task, {**entry.params, **task_point}, {**fields, **model_point},
                                       train)
                    meta = {"task": entry.task, "setting": grid_label(task_point), "model": label,
                            "model_grid": dict(model_point), "train_grid": dict(train_point), "seed": seed}
                    runs.append(PlannedRun(run, meta))
        return SweepPlan(name=self.name, kind="grid", spec=spec, runs=_unique(runs))


def load_spec(name_or_path: str | Path) -> SweepSpec:
    """A packaged preset (``runners/sweep/presets/<name>.yaml``) by name, or a YAML file by path."""
    path = Path(name_or_path)
    # a file wins over a preset of the same name; a folder does not (a sweep's output is often named so)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ValueError(f"no sweep file {str(path)!r}")
        text = path.read_text()
    else:
        names = preset_names()
        if str(name_or_path) not in names:
            raise ValueError(f"unknown sweep preset {str(name_or_path)!r}; presets: {', '.join(names)} "
                             "(or give a .yaml path)")
        text = importlib.resources.files("mixlab.runners.sweep").joinpath("presets", f"{name_or_path}.yaml").read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"cannot read {str(name_or_path)!r} as YAML: {str(exc).splitlines()[0]}") from None
    return SweepSpec.from_dict(data)


def compare_spec(task: str, mixers: Sequence[str], *, task_params: Mapping[str, Any], model: Mapping[str, Any],
                 train: Mapping[str, Any], seeds: int) -> SweepSpec:
    """The sweep of ``mixlab compare``: each mixer (a model labelled by its name, with the other model fields
    ``model``) on ``task`` with ``task_params``, training fields ``train``, seeds 0..seeds-1 (each sets the data
    and the initialisation, so seed s trains every mixer on the same data). ValueError for fewer than two
    mixers, a mixer named twice, or ``mixer`` among the model fields."""
    if len(mixers) < 2 or len(set(mixers)) != len(mixers):
        raise ValueError(f"compare needs two or more distinct mixers, got {list(mixers)}")
    if "mixer" in model:
        raise ValueError("the mixers to compare are given as a list, not as the model field mixer")
    return SweepSpec.from_dict({
        "name": "compare-" + task.replace("/", "-"), "description": f"{', '.join(mixers)} on {task}",
        "tasks": [{"task": task, "params": dict(task_params)}],
        "models": {mixer: {**model, "mixer": mixer} for mixer in mixers}, "train": dict(train), "seeds": seeds})


def reference_claims(names: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The ``reference.claims`` of the sweep files ``names`` (presets or YAML paths), by name: what the claims
    ledger (``analysis.ledger.write_ledger``) judges for a paper that no folder holds records of."""
    return {name: load_spec(name).reference.get("claims", []) for name in names}


def preset_names() -> list[str]:
    """Names of the packaged sweep presets (``runners/sweep/presets/*.yaml``)."""
    folder = importlib.resources.files("mixlab.runners.sweep").joinpath("presets")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def grid_label(point: Mapping[str, Any]) -> str:
    """``{"d_model": 32, "lr": 0.001}`` -> ``"d_model=32 lr=0.001"``; the empty point -> ``"default"``."""
    return " ".join(f"{k}={_fmt(v)}" for k, v in point.items()) or "default"


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _section(where: str, data: Any, cls: type, allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """A mapping of fields of the dataclass ``cls`` (keys in ``allowed``, default all of them), each value as
    YAML read it for the field (``fields.from_yaml``: text in a float field becomes a number), checked against
    the field's annotation here, so that a bad value is named by its place in the file (``train.lr must be a
    positive number, got [0.001]``). Ints stay ints in float fields, as the configs keep them."""
    annotations = field_types(cls)
    data = check_mapping(where, data, annotations if allowed is None else allowed)
    return {key: check(key, from_yaml(key, value, annotations[key], where=where), annotations[key], where=where,
                       keep_ints=True)
            for key, value in data.items()}


def _grid(where: str, data: Any, cls: type, allowed: Iterable[str] | None = None) -> tuple[dict[str, Any], ...]:
    """Grid points: None -> one empty point; {k: [v, ...]} -> the product, keys in order; [{...}] -> as is.
    Each point is a ``_section`` of ``cls``."""
    if data is None:
        return ({},)
    if isinstance(data, Mapping):
        for key, values in data.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{where}.{key} must be a non-empty list, got {values!r}")
        keys = list(data)
        points = [dict(zip(keys, combo)) for combo in itertools.product(*(data[k] for k in keys))]
        return tuple(_section(where, p, cls, allowed) for p in points)
    if isinstance(data, list) and data and all(isinstance(p, Mapping) for p in data):
        return tuple(_section(where, p, cls, allowed) for p in data)
    raise ValueError(f"{where} must be a mapping of lists or a non-empty list of mappings, got {data!r}")


def _unique(runs: list[PlannedRun]) -> list[PlannedRun]:
    """Drop repeated hashes (two grid points that resolve to one config), keeping the first."""
    seen: set[str] = set()
    out = []
    for run in runs:
        if run.hash not in seen:
            seen.add(run.hash)
            out.append(run)
    return out


def _reference(data: Any, entries: Sequence[TaskEntry], model_labels: list[str],
               model_grid: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The paper's results a report prints beside a grid's, and its claims as checks (``analysis.claims``)::

        reference:
          source: "RubiConv paper"
          values:                        # per (task, model): a number and/or a note ("< 25%")
            - {task: packed/noisy_recall, model: rubiconv, value: 1.0, note: "100%"}
          claims:                        # each a sentence of the paper and its check
            - {text: "Boundary-respecting conv beats the leaky one.", difference: [rubiconv, fft_conv_leaky],
               op: ">", each: [task]}
          deviations: ["3 seeds; our model, not the paper's"]   # from the paper's protocol, for the ledger

    A claim that names a model, metric or setting the sweep lacks is refused.
    """
    data = check_mapping("reference", data, {"source", "values", "claims", "deviations"})
    task_names = [e.task for e in entries]
    values = check("reference.values", data.get("values", []), list)
    for i, entry in enumerate(values):
        where = f"reference.values[{i}]"
        check_mapping(where, entry, {"task", "model", "value", "note"}, required={"task", "model"})
        if entry["task"] not in task_names:
            raise ValueError(f"{where}: task {entry['task']!r} is not in the sweep ({', '.join(task_names)})")
        if entry["model"] not in model_labels:
            raise ValueError(f"{where}: model {entry['model']!r} is not in the sweep ({', '.join(model_labels)})")
        check("value", entry.get("value"), float | None, where=where)  # checked only: the number stays as written
    claims = claims_data(data.get("claims", []), entries, model_labels, model_grid)
    deviations = check("reference.deviations", data.get("deviations", []), tuple[str, ...])
    return {"source": str(data.get("source", "")), "values": [dict(v) for v in values], "claims": claims,
            "deviations": list(deviations)}


def claims_data(items: Any, entries: Sequence[TaskEntry], model_labels: list[str],
                model_grid: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The claims of a grid (``analysis.claims``), checked against its models, metrics and settings, in the
    form the manifest keeps. Metrics: the four every run records, and the score groups of the sweep's tasks
    (``acc_present``), found by scoring one generated test row of each task."""
    labels = {"task": list(dict.fromkeys(e.task for e in entries)),
              "setting": list(dict.fromkeys(grid_label(p) for e in entries for p in e.grid))}
    for point in model_grid:
        for key, value in point.items():
            labels.setdefault(key, [])
            if str(value) not in labels[key]:
                labels[key].append(str(value))
    need_groups = isinstance(items, list) and any(
        isinstance(c, Mapping) and c.get("metric") not in (None, *METRIC_KEYS) for c in items)
    groups = _score_groups(entries) if need_groups else []
    names = claims.Names(models=model_labels, metrics=[*METRIC_KEYS, *groups], labels=labels)
    return [claims.claim_dict(c) for c in claims.parse_claims(items, names)]


def _score_groups(entries: Sequence[TaskEntry]) -> list[str]:
    """``acc_<group>`` for every score group of the sweep's tasks (``Task.score_groups``), in order."""
    groups: list[str] = []
    for entry in entries:
        for point in entry.grid:
            task = tasks.get_task(entry.task, **{**entry.params, **point})
            targets = task.generate(1, seed=0, split="test").targets
            groups += [f"acc_{g}" for g in task.score_groups(targets) if f"acc_{g}" not in groups]
    return groups
