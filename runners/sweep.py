"""Sweeps: a grid of runs, each named by the hash of its resolved config, that survives crashes.

An output folder holds::

    <out>/sweep.json          manifest: the sweep's spec and every planned run (hash, config, labels),
                              written atomically when the sweep starts
    <out>/runs/<hash>.json    one record per finished run, written atomically by the run itself

A record appears whole or not at all (temporary file, fsync, rename), so a crash, ``kill -9`` or Ctrl-C loses
only the runs in flight; running the same sweep again skips every hash that already has a record. A folder
holds one sweep: starting a different one there (another spec, seeds aside) is refused; adding seeds is fine.

Execution: the missing runs are grouped into jobs (``plan_jobs``): runs that the batched engine
(``runners.engine``) can stack, at most ``max_stack`` of them, trained together by ``run_job``; a run that
cannot stack is a job alone. The local backend runs the jobs in this process or ``workers`` spawned
processes; the Ray backend (``runners.ray_backend``) makes each job a Ray task. A stacked run's record equals
the one it would get alone (on the CPU bitwise, time fields aside), so the grouping changes no result.

The hash is ``runners.train.config_hash`` of the *resolved* config: task parameters with every default filled
in and every ModelConfig field (except vocab_size and max_seq_len, which the task fixes), so writing a default
out or leaving it implicit names the same run, and a later change of a default does not reuse old records.

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
model_grid, train_grid and seed; ``analysis.aggregate`` groups by them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import importlib.resources
import itertools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from mixlab import models, tasks
from mixlab.runners.engine import group_key, train_runs_batched, unbatchable_reason
from mixlab.runners.train import RunConfig, TrainConfig, config_hash, resolve, train_run, write_json_atomic
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

    from mixlab.runners.ray_backend import RayOptions

MANIFEST = "sweep.json"
RUNS = "runs"
MANIFEST_FORMAT = 1
# ModelConfig fields the task sets (resolve() fills them in); a grid may not set them.
TASK_FIXED_MODEL_FIELDS = ("vocab_size", "max_seq_len")
# TrainConfig fields the seeds set.
SEED_FIELDS = ("init_seed", "data_seed")
METRICS = ("acc_micro", "acc_macro")
# Runs per job (one stack of the batched engine): bounds what a stopped or failed job loses, and memory.
DEFAULT_MAX_STACK = 64
BACKENDS = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: its hash (the record's file stem), its resolved config and its labels."""

    hash: str
    config: RunConfig
    meta: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """Every run of a sweep; ``spec`` (JSON-ready) identifies it in the manifest; ``kind`` is grid or mad."""

    name: str
    kind: str
    spec: dict[str, Any]
    runs: list[PlannedRun]


@dataclasses.dataclass(frozen=True)
class SweepResult:
    total: int
    skipped: int
    ran: int
    out_dir: Path
    not_started: int = 0  # runs left untouched because ``stop_after`` had passed


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
    metric: str = "acc_micro"
    reference: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> SweepSpec:
        """Parse and check a grid description (the YAML's top-level mapping); ValueError names what is bad."""
        _check_keys("sweep", data, {f.name for f in dataclasses.fields(cls)},
                    required={"name", "tasks", "models"})
        name = data["name"]
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"sweep name must be a plain non-empty string, got {name!r}")
        vary_data = data.get("vary_data_seed", True)
        if not isinstance(vary_data, bool):
            raise ValueError(f"vary_data_seed must be true or false, got {vary_data!r}")
        train_fields = {f.name for f in dataclasses.fields(TrainConfig)} - set(SEED_FIELDS)
        if not vary_data:
            train_fields.add("data_seed")
        model_fields = {f.name for f in dataclasses.fields(models.ModelConfig)} - set(TASK_FIXED_MODEL_FIELDS)

        entries = data["tasks"]
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"tasks must be a non-empty list, got {entries!r}")
        task_entries = []
        for i, entry in enumerate(entries):
            where = f"tasks[{i}]"
            _check_keys(where, entry, {"task", "params", "grid", "train"}, required={"task"})
            if entry["task"] not in tasks.TASKS:
                raise ValueError(f"{where}: unknown task {entry['task']!r}; known: {', '.join(tasks.TASKS)}")
            train = _numbers(f"{where}.train", entry.get("train", {}), TrainConfig)
            _check_keys(f"{where}.train", train, train_fields)
            params_cls = tasks.TASKS[entry["task"]].Params
            params = _numbers(f"{where}.params", entry.get("params", {}), params_cls)
            grid = _grid(f"{where}.grid", entry.get("grid"), params_cls)
            task_entries.append(TaskEntry(task=entry["task"], params=params, grid=grid, train=train))

        variants = _mapping("models", data["models"])
        if not variants:
            raise ValueError("models must name at least one model")
        resolved_models = {}
        for label, fields in variants.items():
            fields = _numbers(f"models.{label}", fields if fields is not None else {}, models.ModelConfig)
            preset = fields.pop("preset", None)
            _check_keys(f"models.{label}", fields, model_fields)
            if preset is not None:
                if preset not in models.PRESETS:
                    raise ValueError(f"models.{label}: unknown preset {preset!r}; "
                                     f"choose from {sorted(models.PRESETS)}")
                fields = {**models.PRESETS[preset], **fields}
            resolved_models[str(label)] = fields

        model_grid = _grid("model_grid", data.get("model_grid"), models.ModelConfig)
        for point in model_grid:
            _check_keys("model_grid", point, model_fields)
        train = _numbers("train", data.get("train", {}), TrainConfig)
        _check_keys("train", train, train_fields)
        train_grid = _grid("train_grid", data.get("train_grid"), TrainConfig)
        for point in train_grid:
            _check_keys("train_grid", point, train_fields)
        metric = data.get("metric", "acc_micro")
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
        reference = _reference(data.get("reference", {}), [e.task for e in task_entries], list(resolved_models))
        return cls(name=name, description=str(data.get("description", "")), tasks=tuple(task_entries),
                   models=resolved_models, model_grid=model_grid, train=train, train_grid=train_grid,
                   seeds=parse_seeds(data.get("seeds", 1)), vary_data_seed=vary_data, metric=metric,
                   reference=reference)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, saved in the manifest."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def plan(self, *, device: str | None = None, seeds: Sequence[int] | None = None) -> SweepPlan:
        """Expand into runs (hash, resolved config, labels); ``device`` and ``seeds`` override the spec's.

        Every config is resolved (and so checked) here, before anything trains.
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
                    config = resolver.config(entry.task, {**entry.params, **task_point},
                                             {**fields, **model_point}, train)
                    meta = {"task": entry.task, "setting": grid_label(task_point), "model": label,
                            "model_grid": dict(model_point), "train_grid": dict(train_point), "seed": seed}
                    runs.append(PlannedRun(config_hash(config), config, meta))
        return SweepPlan(name=self.name, kind="grid", spec=spec, runs=_unique(runs))


def load_spec(name_or_path: str | Path) -> SweepSpec:
    """A packaged preset (``runners/presets/<name>.yaml``) by name, or a YAML file by path."""
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
        text = importlib.resources.files("mixlab.runners").joinpath("presets", f"{name_or_path}.yaml").read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"cannot read {str(name_or_path)!r} as YAML: {str(exc).splitlines()[0]}") from None
    return SweepSpec.from_dict(data)


def preset_names() -> list[str]:
    """Names of the packaged sweep presets (``runners/presets/*.yaml``)."""
    folder = importlib.resources.files("mixlab.runners").joinpath("presets")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def grid_label(point: Mapping[str, Any]) -> str:
    """``{"d_model": 32, "lr": 0.001}`` -> ``"d_model=32 lr=0.001"``; the empty point -> ``"default"``."""
    return " ".join(f"{k}={_fmt(v)}" for k, v in point.items()) or "default"


def resolved_config(task: str, params: Mapping[str, Any], model: Mapping[str, Any],
                    train: Mapping[str, Any]) -> RunConfig:
    """The resolved RunConfig (every task parameter, every model field) of one run; its hash names the run."""
    return Resolver().config(task, params, model, train)


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _check_keys(where: str, data: Any, allowed: set[str], required: set[str] = frozenset()) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping, got {data!r}")
    unknown = sorted(str(k) for k in set(data) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(data))
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")


def _mapping(where: str, data: Any) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping, got {data!r}")
    return dict(data)


def _numbers(where: str, data: Any, cls: type) -> dict[str, Any]:
    """``data`` as a dict; text that reads as a number becomes a float where ``cls`` has a float field."""
    fields = _mapping(where, data)
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in fields.items():
        hint = hints.get(key)
        is_float = hint is float or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                                     and float in typing.get_args(hint))
        if is_float and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{where}.{key} must be a number, got {value!r}") from None
        out[key] = value
    return out


def _grid(where: str, data: Any, cls: type) -> tuple[dict[str, Any], ...]:
    """Grid points: None -> one empty point; {k: [v, ...]} -> the product, keys in order; [{...}] -> as is.
    Values are read as fields of ``cls`` (``_numbers``)."""
    if data is None:
        return ({},)
    if isinstance(data, Mapping):
        for key, values in data.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{where}.{key} must be a non-empty list, got {values!r}")
        keys = list(data)
        points = [dict(zip(keys, combo)) for combo in itertools.product(*(data[k] for k in keys))]
        return tuple(_numbers(where, p, cls) for p in points)
    if isinstance(data, list) and data and all(isinstance(p, Mapping) for p in data):
        return tuple(_numbers(where, p, cls) for p in data)
    raise ValueError(f"{where} must be a mapping of lists or a non-empty list of mappings, got {data!r}")


def parse_seeds(data: Any) -> tuple[int, ...]:
    if isinstance(data, int) and not isinstance(data, bool):
        if data < 1:
            raise ValueError(f"seeds must be at least 1, got {data}")
        return tuple(range(data))
    if (isinstance(data, (list, tuple)) and data and len(set(data)) == len(data)
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in data)):
        return tuple(data)
    raise ValueError(f"seeds must be a count or a list of distinct non-negative integers, got {data!r}")


def _unique(runs: list[PlannedRun]) -> list[PlannedRun]:
    """Drop repeated hashes (two grid points that resolve to one config), keeping the first."""
    seen: set[str] = set()
    out = []
    for run in runs:
        if run.hash not in seen:
            seen.add(run.hash)
            out.append(run)
    return out


class Resolver:
    """Builds resolved RunConfigs, resolving each (task, params, model) once for all its training points."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def config(self, task: str, params: Mapping[str, Any], model: Mapping[str, Any],
               train: Mapping[str, Any]) -> RunConfig:
        key = json.dumps([task, params, model], sort_keys=True, default=str)
        if key not in self._cache:
            run = RunConfig(task=task, task_params=dict(params), model=dict(model))
            task_obj, model_config = resolve(run)
            full = {k: v for k, v in model_config.to_dict().items() if k not in TASK_FIXED_MODEL_FIELDS}
            self._cache[key] = (dataclasses.asdict(task_obj.params), full)
        task_params, full_model = self._cache[key]
        try:
            train_config = TrainConfig(**train)
        except TypeError as exc:
            raise ValueError(f"bad training fields {sorted(train)}: {exc}") from None
        return RunConfig(task=task, task_params=dict(task_params), model=dict(full_model), train=train_config)


def finished_hashes(out_dir: str | Path) -> set[str]:
    """Hashes with a complete record under ``<out_dir>/runs`` (a file that parses as a JSON record)."""
    return {path.stem for path in (Path(out_dir) / RUNS).glob("*.json") if is_record(path)}


def is_record(path: Path) -> bool:
    """Whether ``path`` holds a finished run's record (a JSON object with ``final``): a run is finished iff
    its ``<hash>.json`` is one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "final" in record


def write_manifest(out_dir: str | Path, plan: SweepPlan) -> Path:
    """Write ``<out_dir>/sweep.json`` atomically; refuse a folder that holds a different sweep.

    Runs that an earlier manifest of the same sweep listed (other seeds) stay listed.
    """
    path = Path(out_dir) / MANIFEST
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    spec = json.loads(json.dumps(plan.spec))
    runs = [{"hash": r.hash, "config": r.config.to_dict(), "meta": r.meta} for r in plan.runs]
    created = now
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            raise ValueError(f"{str(path)!r} is not a readable manifest") from None
        if old.get("kind") != plan.kind or _identity(old.get("spec", {})) != _identity(spec):
            raise ValueError(f"{str(out_dir)!r} holds a different sweep ({old.get('name')!r}, "
                             f"{old.get('kind')}); choose another output folder")
        new = {r["hash"] for r in runs}
        runs = [r for r in old.get("runs", []) if r["hash"] not in new] + runs
        created = old.get("created", now)
    manifest = {"format": MANIFEST_FORMAT, "name": plan.name, "kind": plan.kind, "spec": spec, "runs": runs,
                "created": created, "updated": now, "argv": sys.argv}
    write_json_atomic(path, manifest)
    return path


def _identity(spec: Mapping[str, Any]) -> str:
    """What makes two specs the same sweep: everything but the seeds and the words around it."""
    return json.dumps({k: v for k, v in spec.items() if k not in ("seeds", "description", "reference")},
                      sort_keys=True)


def _reference(data: Any, task_names: list[str], model_labels: list[str]) -> dict[str, Any]:
    """The paper's results a report prints beside a grid's::

        reference:
          source: "RubiConv paper (SPEC 3.4)"
          values:                        # per (task, model): a number and/or a note ("< 25%")
            - {task: packed/noisy_recall, model: rubiconv, value: 1.0, note: "100%"}
          claims: ["dynamic conv beats static conv beats no conv at every width"]
    """
    _check_keys("reference", data, {"source", "values", "claims"})
    values = data.get("values", [])
    if not isinstance(values, list):
        raise ValueError(f"reference.values must be a list, got {values!r}")
    for i, entry in enumerate(values):
        where = f"reference.values[{i}]"
        _check_keys(where, entry, {"task", "model", "value", "note"}, required={"task", "model"})
        if entry["task"] not in task_names:
            raise ValueError(f"{where}: task {entry['task']!r} is not in the sweep ({', '.join(task_names)})")
        if entry["model"] not in model_labels:
            raise ValueError(f"{where}: model {entry['model']!r} is not in the sweep ({', '.join(model_labels)})")
        value = entry.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{where}: value must be a number, got {value!r}")
    claims = data.get("claims", [])
    if not isinstance(claims, list) or not all(isinstance(c, str) for c in claims):
        raise ValueError(f"reference.claims must be a list of strings, got {claims!r}")
    return {"source": str(data.get("source", "")), "values": [dict(v) for v in values], "claims": list(claims)}


@dataclasses.dataclass(frozen=True)
class Job:
    """Runs trained by one call of the engine: one stack (runs of equal ``job_key``, at most ``max_stack``) or
    one run that cannot stack. Plain data, (hash, config dict) pairs, so it pickles to a spawned process or to
    a Ray task."""

    runs: tuple[tuple[str, dict[str, Any]], ...]

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def hashes(self) -> list[str]:
        return [name for name, _ in self.runs]

    @property
    def device(self) -> str:
        """The runs' ``device`` setting as written (``auto``, ``cpu`` or ``cuda``; equal within a job)."""
        return self.runs[0][1]["train"]["device"]

    @property
    def label(self) -> str:
        """``<task> <mixer> x<runs>`` of the first run, for progress and task names."""
        config = self.runs[0][1]
        return f"{config['task']} {config['model']['mixer']} x{len(self)}"


def job_key(config: RunConfig) -> tuple:
    """Runs with equal keys may share a job: ``engine.group_key`` as on the CPU, plus the device and precision
    as written, which fix the rest of the engine's key wherever the job runs. A planner without a GPU can so
    group runs for ``cuda`` (a driver of a Ray cluster); the engine groups them the same on the worker."""
    on_cpu = dataclasses.replace(config, train=dataclasses.replace(config.train, device="cpu"))
    return group_key(on_cpu), config.train.device, config.train.precision


def plan_jobs(runs: Sequence[PlannedRun], max_stack: int = DEFAULT_MAX_STACK) -> list[Job]:
    """Runs of equal ``job_key`` in plan order, ``max_stack`` to a job; a run the engine cannot stack
    (``engine.unbatchable_reason``: packed tasks, Triton kernels) is a job of its own. Jobs are ordered by
    their first run, so the first jobs hold the plan's first runs (its first seeds)."""
    if isinstance(max_stack, bool) or not isinstance(max_stack, int) or max_stack < 1:
        raise ValueError(f"max_stack must be a positive integer, got {max_stack!r}")
    groups: dict[tuple, list[int]] = {}
    for i, run in enumerate(runs):
        key = ("alone", run.hash) if unbatchable_reason(run.config) is not None else job_key(run.config)
        groups.setdefault(key, []).append(i)
    chunks = [members[lo : lo + max_stack] for members in groups.values()
              for lo in range(0, len(members), max_stack)]
    return [Job(tuple((runs[i].hash, runs[i].config.to_dict()) for i in chunk)) for chunk in sorted(chunks)]


def run_job(job: Job, runs_dir: str | Path | None, *, batch: bool = True, compile: bool = False,
            cuda_graph: bool = False) -> list[dict[str, Any]]:
    """Train the runs of ``job`` that have no record in ``runs_dir`` yet; return their records.

    Each record goes to ``<runs_dir>/<hash>.json`` (atomically) as soon as its run ends, so a job run again
    (resumed after a crash, or retried) trains only its missing runs and never writes a run twice. runs_dir
    None: nothing is skipped or written (the Ray backend's tasks; the driver writes). batch: the runs
    trained stacked by ``engine.train_runs_batched`` (with its ``compile`` and ``cuda_graph`` options);
    False: one at a time by ``train_run``.
    """
    if not batch and (compile or cuda_graph):
        raise ValueError(f"compile={compile} and cuda_graph={cuda_graph} are options of the batched engine; "
                         "they need batch=True")
    todo = [(name, RunConfig.from_dict(config)) for name, config in job.runs
            if runs_dir is None or not is_record(Path(runs_dir) / f"{name}.json")]
    if not todo:
        return []
    names, configs = [name for name, _ in todo], [config for _, config in todo]
    if batch:
        return train_runs_batched(configs, out_dir=runs_dir, run_names=names, progress=False, compile=compile,
                                  cuda_graph=cuda_graph)
    return [train_run(config, out_dir=runs_dir, run_name=name, progress=False)
            for name, config in zip(names, configs)]


def run_sweep(plan: SweepPlan, out_dir: str | Path, *, workers: int = 1, limit: int | None = None,
              tasks: Sequence[str] | None = None, models: Sequence[str] | None = None,
              stop_after: float | None = None, progress: bool = True,
              batch: bool = True,
              max_stack: int = DEFAULT_MAX_STACK, compile: bool = False, cuda_graph: bool = False,
              backend: str = "local",
              ray_options: RayOptions | None = None,
              cuda_devices: Sequence[int] | None = None) -> SweepResult:
    """Run every run of ``plan`` without a record in ``out_dir`` yet; a tqdm bar counts runs, with an ETA.

    The missing runs are split into jobs (``plan_jobs``): runs that stack, ``max_stack`` at a time, each job
    trained by one call of the batched engine (``run_job``); ``batch=False`` trains one run per job with
    ``train_run`` (max_stack is then 1). ``compile`` and ``cuda_graph`` are the engine's speed options.
    workers: the local backend keeps this many jobs going: 1 in this process, N > 1 in spawned processes
        (on a GPU they share it; each gets cores // N torch threads, cores = those this process may run on).
    cuda_devices: the local backend's workers go round-robin to these CUDA devices (indices as this process
        sees them), each worker seeing only its own as ``cuda``: one sweep uses every GPU of a host. Workers
        are processes then, also for workers=1; at least one worker per device.
    backend: ``local``, or ``ray``: each job a Ray task (``runners.ray_backend``, options ``ray_options``);
        needs ``pip install mixlab[ray]``, and workers must be 1 (Ray schedules the jobs by resources).
    limit: run at most this many of the missing runs (to fit a time budget; run again to continue).
    tasks: train only the missing runs of these tasks now (e.g. to finish some tasks for every model first);
        the manifest still holds the whole plan, so reports count the other runs as missing.
    models: likewise for these models (the spec's model names), e.g. to split one grid over two GPUs.
    stop_after: seconds after which no new job starts; jobs in flight finish and the sweep returns (local
        backend). Under a hard time limit (a 10-minute GPU call), set it to the limit minus the longest job, so a
        kill at the limit does not throw away jobs that were nearly done.
    A run that raises stops the sweep (finished records stay); so does Ctrl-C, without partial records. With
    workers > 1, a job out of device memory beside others runs again alone after them (``_run_pool``).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int | float)
                                   or not stop_after >= 0):
        raise ValueError(f"stop_after must be a non-negative number of seconds, got {stop_after!r}")
    if stop_after is not None and backend == "ray":
        raise ValueError("stop_after is for the local backend")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "ray" and workers != 1:
        raise ValueError(f"workers={workers} is for the local backend; Ray runs as many jobs at once as its "
                         "resources allow (cpus_per_job, gpus_per_job)")
    device_ids = None
    if cuda_devices is not None:
        cuda_devices = list(cuda_devices)
        if (not cuda_devices or len(set(cuda_devices)) != len(cuda_devices)
                or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in cuda_devices)):
            raise ValueError(f"cuda_devices must be distinct non-negative device indices, got {cuda_devices!r}")
        if backend != "local":
            raise ValueError("cuda_devices is for the local backend (Ray places jobs on GPUs itself)")
        if workers < len(cuda_devices):
            raise ValueError(f"workers={workers} cannot cover {len(cuda_devices)} cuda_devices: give each at "
                             "least one worker")
        device_ids = _device_ids(cuda_devices)
    if not batch and (compile or cuda_graph):
        raise ValueError(f"compile={compile} and cuda_graph={cuda_graph} need the batched engine "
                         "(batch=True)")
    if backend == "ray":
        # imported here: the backend is optional; checked before anything is written
        from mixlab.runners import ray_backend

        ray_backend.import_ray()
    for label, chosen in (("task", tasks), ("model", models)):
        planned = list(dict.fromkeys(r.meta[label] for r in plan.runs))
        unknown = [v for v in chosen or () if v not in planned]
        if unknown:
            raise ValueError(f"{label} {unknown[0]!r} is not in this sweep; its {label}s: {', '.join(planned)}")
    out = Path(out_dir)
    runs_dir = out / RUNS
    done = finished_hashes(out)
    todo = [r for r in plan.runs if r.hash not in done]
    skipped = len(plan.runs) - len(todo)
    if tasks:
        todo = [r for r in todo if r.meta["task"] in tasks]
    if models:
        todo = [r for r in todo if r.meta["model"] in models]
    if limit is not None:
        todo = todo[:limit]
    jobs = plan_jobs(todo, max_stack if batch else 1)
    runs_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(out, plan)
    engine = {"batch": batch, "compile": compile, "cuda_graph": cuda_graph}
    started = time.monotonic()

    def may_start() -> bool:
        return stop_after is None or time.monotonic() - started < stop_after

    ran = 0
    finished = 0  # runs of jobs that ended (trained now or found with records)
    # smoothing=0: the ETA uses the mean time per run so far; runs differ too much for a moving average.
    bar = tqdm(total=len(plan.runs), initial=skipped, disable=not progress, desc=plan.name, unit="run",
               dynamic_ncols=True, smoothing=0)

    def job_done(job: Job, trained: int) -> None:
        """Every run of ``job`` has its record now; ``trained`` of them were trained by this sweep."""
        nonlocal ran, finished
        ran += trained
        finished += len(job)
        bar.update(len(job))

    try:
        if backend == "ray":
            ray_backend.run_jobs(jobs, runs_dir, ray_options or ray_backend.RayOptions(), engine, job_done)
        elif workers == 1 and device_ids is None:
            for job in jobs:
                if not may_start():
                    break
                job_done(job, len(run_job(job, runs_dir, **engine)))
        else:
            _run_pool(jobs, runs_dir, workers, engine, job_done, may_start, device_ids=device_ids)
    finally:
        bar.close()
    return SweepResult(total=len(plan.runs), skipped=skipped, ran=ran, out_dir=out,
                       not_started=sum(len(job) for job in jobs) - finished)


def _device_ids(cuda_devices: Sequence[int]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entry of each of this process's device indices (its own list maps them when
    set, as in a sweep pinned to some GPUs of a host); an index it does not see raises ValueError."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in visible.split(",")] if visible else None
    count = torch.cuda.device_count() if torch.cuda.is_available() else len(ids) if ids else None
    if count is not None and max(cuda_devices) >= count:
        raise ValueError(f"cuda_devices {list(cuda_devices)} names a device this process does not see "
                         f"({count} visible)")
    return [ids[d] if ids else str(d) for d in cuda_devices]


def _take_device(device_ids: Sequence[str], started: Synchronized) -> str:
    """The device of the next worker to start: round-robin over ``device_ids`` by ``started``, a counter
    shared by the pool's workers."""
    with started.get_lock():
        index = started.value
        started.value += 1
    return device_ids[index % len(device_ids)]


def _init_worker(threads: int, parent: int, device_ids: Sequence[str] | None = None,
                 started: Synchronized | None = None) -> None:
    # The parent handles Ctrl-C and ends the workers; a worker ended mid-run has not written its record.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    if device_ids:
        # before this process touches CUDA: its one device becomes "cuda" (cuda:0) for every run it trains
        os.environ["CUDA_VISIBLE_DEVICES"] = _take_device(device_ids, started)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """End this worker once the sweep process is gone (kill -9): it would otherwise wait for work forever,
    holding its memory and GPU context."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


class JobOutOfMemory(RuntimeError):
    """A job of a sweep ran out of device memory (its message: the allocator's first line)."""


def _run_in_worker(job: Job, runs_dir: str, engine: dict[str, bool]) -> int:
    try:
        return len(run_job(job, runs_dir, **engine))
    except torch.OutOfMemoryError as exc:
        message = str(exc).splitlines()[0]
    # out of the except block, the failed job's frames and tensors are gone: give their cached blocks back to
    # the device, for the other workers that share it
    torch.cuda.empty_cache()
    raise JobOutOfMemory(message)


def _run_pool(jobs: list[Job], runs_dir: Path, workers: int, engine: dict[str, bool],
              job_done: Callable[[Job, int], None], may_start: Callable[[], bool],
              run: Callable[[Job, str, dict[str, bool]], int] = _run_in_worker,
              device_ids: Sequence[str] | None = None) -> None:
    """Keep ``workers`` jobs in flight and nothing queued behind them, so a stop abandons only those; a new
    job starts only while ``may_start()``. With ``device_ids`` (``_device_ids``) worker k sees only device
    ``device_ids[k % len(device_ids)]``.

    A job that runs out of device memory beside others (jobs share a GPU) does not stop the sweep: it runs
    again after the other jobs, alone (it keeps the records its early-stopped runs wrote); out of memory
    alone, it stops the sweep like any failure. ``run`` trains a job in a worker (tests replace it)."""
    before = set(multiprocessing.active_children())
    # the cores this process may use (taskset, cgroup cpusets), not the machine's: sweeps pinned side by side
    # must not each start a thread per core
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // workers)
    context = multiprocessing.get_context("spawn")
    executor = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_init_worker,
        initargs=(threads, os.getpid(), device_ids, context.Value("i", 0)))
    pending = iter(jobs)
    in_flight: dict[concurrent.futures.Future, Job] = {}
    deferred: list[Job] = []  # ran out of memory beside other jobs: again, alone, once the rest is done
    alone: set[concurrent.futures.Future] = set()

    def submit(n: int) -> None:
        for _ in range(n):
            if not may_start():
                return
            job = next(pending, None)
            if job is None:
                if deferred and not in_flight:  # the rest is done: a deferred job, alone
                    job = deferred.pop(0)
                    alone.add(future := executor.submit(run, job, str(runs_dir), engine))
                    in_flight[future] = job
                return
            in_flight[executor.submit(run, job, str(runs_dir), engine)] = job

    try:
        submit(workers)
        while in_flight:
            finished, _ = concurrent.futures.wait(in_flight, return_when="FIRST_COMPLETED")
            for future in finished:
                job = in_flight.pop(future)
                try:
                    trained = future.result()
                except JobOutOfMemory as exc:
                    if future in alone:
                        raise
                    deferred.append(job)
                    tqdm.write(f"out of memory beside other jobs ({exc}); the job of {len(job)} runs runs again "
                               "alone after the others")
                else:
                    job_done(job, trained)
                submit(1)
    except BaseException:
        # Ctrl-C or a failed run: end the other workers now instead of waiting for their runs.
        executor.shutdown(wait=False, cancel_futures=True)
        for child in set(multiprocessing.active_children()) - before:
            child.terminate()
        executor.shutdown(wait=True)  # reaps the ended workers and releases the pool's locks
        raise
    executor.shutdown(wait=True)
