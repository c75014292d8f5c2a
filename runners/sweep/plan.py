"""What a sweep plans: its runs (``PlannedRun``: hash, resolved config, labels) in one ``SweepPlan``.

Two planners build plans: ``spec.SweepSpec.plan`` (YAML grids) and ``mad.mad_plan`` (the MAD protocol).
Both name a run by ``runners.train.config.config_hash`` of its *resolved* config (``Resolver``): task parameters with
every default filled in and every ModelConfig field (except vocab_size and max_seq_len, which the task fixes), so
writing a default out or leaving it implicit names the same run, and a later change of a default does not reuse
old records. A field added later (``core.fields.added_field``) is left out while it holds its default, so the
records written before it existed keep their names.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from mixlab.core.fields import NonNegativeInt, PositiveInt, check, from_mapping, resolved_fields
from mixlab.runners.train.config import RunConfig, TrainConfig, resolve

# ModelConfig fields the task sets (resolve() fills them in); a grid may not set them.
TASK_FIXED_MODEL_FIELDS = ("vocab_size", "max_seq_len")


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


def parse_seeds(data: Any) -> tuple[int, ...]:
    """A seed count N (seeds 0..N-1) or a list of distinct non-negative seeds, as a tuple."""
    if not isinstance(data, list | tuple):
        return tuple(range(check("seeds", data, PositiveInt)))
    seeds = check("seeds", data, tuple[NonNegativeInt, ...])
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a count or a list of distinct non-negative integers, got {data!r}")
    return seeds


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
            full = {k: v for k, v in resolved_fields(model_config).items() if k not in TASK_FIXED_MODEL_FIELDS}
            self._cache[key] = (resolved_fields(task_obj.params), full)
        task_params, full_model = self._cache[key]
        train_config = from_mapping(TrainConfig, train, where="train")
        return RunConfig(task=task, task_params=dict(task_params), model=dict(full_model), train=train_config)


def resolved_config(task: str, params: Mapping[str, Any], model: Mapping[str, Any],
                    train: Mapping[str, Any]) -> RunConfig:
    """The resolved RunConfig (every task parameter, every model field) of one run; its hash names the run."""
    return Resolver().config(task, params, model, train)
