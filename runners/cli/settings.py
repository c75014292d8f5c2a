"""What the commands read from ``--set key=value`` and from a run file (``mixlab run --config FILE.yaml``): task
parameters, model fields and training fields, each routed to its place and typed by the field's annotation.

A run file is a YAML mapping of the same fields as ``--set`` (a prefix ``task.``, ``model.`` or ``train.`` where a
name is ambiguous), plus ``task``, the task's name::

    task: mqar
    mixer: static_conv        # model fields
    d_model: 64
    seq_len: 128              # task parameters
    num_kv_pairs: 8
    lr: 1.0e-3                # training fields
    steps: 400

YAML 1.1 reads ``1e-3`` as text; text in a float field is read as a number, as in sweep files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from mixlab import models, tasks
from mixlab.core import fields
from mixlab.runners.sweep.plan import TASK_FIXED_MODEL_FIELDS
from mixlab.runners.train.config import TrainConfig

SET_HELP = "Task parameter, key=value (repeatable), e.g. --set seq_len=128 --set key_lengths=1,2,3."
RUN_SET_HELP = (
    "key=value (repeatable) for a task parameter, a model field or a training field, e.g. --set seq_len=64 "
    "--set d_model=64 --set lr=1e-3; prefix task., model. or train. when a name is ambiguous."
)
LOG_HELP = ("Also log the evaluations to TensorBoard: --log tensorboard DIR, one TensorBoard run per run (pip "
            "install 'mixlab[tensorboard]').")
SPACES = ("task", "model", "train")


@dataclasses.dataclass(frozen=True)
class RunFields:
    """A run's task and the values set for it, by where they go: task parameters, model fields, training fields."""

    task: str
    task_params: dict[str, Any]
    model: dict[str, Any]
    train: dict[str, Any]

    def over(self, other: RunFields) -> RunFields:
        """These values, then ``other``'s over them (``other``'s task)."""
        return RunFields(other.task, {**self.task_params, **other.task_params}, {**self.model, **other.model},
                         {**self.train, **other.train})


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """``["a=1", "b=2,3"]`` -> ``{"a": "1", "b": "2,3"}``; a malformed item raises ValueError naming it."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value
    return out


def build_task(name: str, assignments: list[str] | None) -> tasks.Task:
    """The task ``name`` (a registry name, a plugin's or an import path) with the ``--set`` parameters given."""
    params = tasks.task_class(name).parse_params(parse_assignments(assignments))
    return tasks.get_task(name, **params)


def field_spaces(task: str) -> dict[str, Mapping[str, Any]]:
    """The fields a run of ``task`` may set, by space: its parameters, the model's (not those the task fixes) and
    the training's, each name with its annotation."""
    return {"task": fields.field_types(tasks.task_class(task).Params),
            "model": {k: v for k, v in fields.field_types(models.ModelConfig).items()
                      if k not in TASK_FIXED_MODEL_FIELDS},
            "train": fields.field_types(TrainConfig)}


def route(task: str, key: str, spaces: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """(space, field) of ``key`` (``lr`` or ``train.lr``); ValueError for an unknown or ambiguous key."""
    space, _, field = key.rpartition(".")
    if space:
        if space not in spaces or field not in spaces[space]:
            raise ValueError(f"unknown parameter {key!r}")
        return space, field
    owners = [name for name, names in spaces.items() if field in names]
    if not owners:
        raise ValueError(f"unknown parameter {key!r} (not a parameter of task {task!r}, a model field or a "
                         "training field)")
    if len(owners) > 1:
        raise ValueError(f"parameter {key!r} is ambiguous: write " + " or ".join(f"{o}.{key}" for o in owners))
    return owners[0], field


def split_run_assignments(task: str, assignments: list[str] | None) -> RunFields:
    """Route ``--set`` items to task parameters, model fields and training fields, typed; ambiguity or unknown
    keys raise."""
    spaces = field_spaces(task)
    out: dict[str, dict[str, Any]] = {space: {} for space in SPACES}
    for key, text in parse_assignments(assignments).items():
        space, field = route(task, key, spaces)
        out[space][field] = fields.parse(field, text, spaces[space][field], where=space)
    return RunFields(task, out["task"], out["model"], out["train"])


def read_run_file(path: str | Path) -> dict[str, Any]:
    """The mapping of a run file (module docstring), as YAML reads it; ValueError for a missing file, YAML that
    does not parse, or anything but a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no run file {str(path)!r}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"cannot read {str(path)!r} as YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a mapping of fields (task: NAME, lr: 1.0e-3, ...), got "
                         f"{type(data).__name__}")
    return data


def run_file_fields(data: Mapping[str, Any], where: str, task: str | None = None) -> RunFields:
    """A run file's fields, routed and checked: every value named by its place in the file (``run.yaml: train.lr
    must be a positive number, got 'fast'``). ``task``: the command line's, over the file's."""
    values = dict(data)
    task = task or values.pop("task", None)
    values.pop("task", None)
    if not isinstance(task, str) or not task:
        raise ValueError(f"{where}: name the task (task: NAME) or give it on the command line")
    spaces = field_spaces(task)
    out: dict[str, dict[str, Any]] = {space: {} for space in SPACES}
    for key, value in values.items():
        space, field = route(task, str(key), spaces)
        annotation = spaces[space][field]
        # as --set reads them: an int in a float field becomes a float, so the file and --set name one run
        place = f"{where}: {space}"
        out[space][field] = fields.check(field, fields.from_yaml(field, value, annotation, where=place), annotation,
                                         where=place)
    return RunFields(task, out["task"], out["model"], out["train"])


def command_fields(task: str | None, assignments: list[str] | None, run_file: Mapping[str, Any] | None,
                   where: str | None = None) -> RunFields:
    """The fields of a command: those of its run file (``read_run_file``, read from ``where``), then its ``--set``
    items over them; its task from the command line, else the file's."""
    if run_file is not None:
        from_file = run_file_fields(run_file, where or "run file", task)
        return from_file.over(split_run_assignments(from_file.task, assignments))
    if task is None:
        raise ValueError("give a TASK, or a --config file that names one (task: NAME)")
    return split_run_assignments(task, assignments)
