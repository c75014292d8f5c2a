"""What a sweep plans: its runs (``PlannedRun``: the resolved run and its labels) in one ``SweepPlan``.

Two planners build plans: ``spec.SweepSpec.plan`` (YAML grids) and ``mad.mad_plan`` (the MAD protocol).
Both name a run by ``runners.train.config.config_hash`` of its *resolved* config (``Resolver``): task parameters with
every default filled in and every ModelConfig field (except vocab_size and max_seq_len, which the task fixes), so
writing a default out or leaving it implicit names the same run, and a later change of a default does not reuse
old records. A field added later (``core.fields.added_field``) is left out while it holds its default, so the
records written before it existed keep their names.

Each run is resolved here, once (``runners.train.resolved.ResolvedRun``): its jobs, the engine and its record
read the value the plan made.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from mixlab.core.fields import NonNegativeInt, PositiveInt, check, from_mapping, resolved_fields
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.resolved import ResolvedRun, resolve

# ModelConfig fields the task sets (resolve() fills them in); a grid may not set them. The task's objective is
# kept in the resolved config: the hashes of the runs planned before the task declared it include it.
TASK_FIXED_MODEL_FIELDS = ("vocab_size", "max_seq_len")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: the run, resolved, and its labels."""

    resolved: ResolvedRun
    meta: dict[str, Any]

    @property
    def hash(self) -> str:
        """The run's name: its record's file stem."""
        return self.resolved.hash

    @property
    def config(self) -> RunConfig:
        """The run's resolved config."""
        return self.resolved.config


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
    """Builds resolved runs, resolving each (task, params, model) once for all its training points: they share its
    task and model config, under a config that spells out every task parameter and model field."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[ResolvedRun, dict[str, Any], dict[str, Any]]] = {}

    def run(self, task: str, params: Mapping[str, Any], model: Mapping[str, Any],
            train: Mapping[str, Any]) -> ResolvedRun:
        key = json.dumps([task, params, model], sort_keys=True, default=str)
        if key not in self._cache:
            base = resolve(RunConfig(task=task, task_params=dict(params), model=dict(model)))
            full = {k: v for k, v in resolved_fields(base.model_config).items() if k not in TASK_FIXED_MODEL_FIELDS}
            self._cache[key] = (base, resolved_fields(base.task.params), full)
        base, task_params, full_model = self._cache[key]
        config = RunConfig(task=task, task_params=dict(task_params), model=dict(full_model),
                           train=from_mapping(TrainConfig, train, where="train"))
        return dataclasses.replace(base, config=config)
