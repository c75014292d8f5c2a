"""What defines a run: its training settings (``TrainConfig``), the whole run (``RunConfig``) and the hash that
names it. What a run resolves to (its task and full model config) is ``runners.train.resolved``.

Configs are typed dataclasses that refuse unknown keys. ``config_hash`` names a run by its whole config: sweeps
find a run's record by it, so the same config must keep giving the same hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from mixlab.core.fields import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    check_dataclass,
    check_mapping,
    from_mapping,
)

SCHEDULES = ("cosine_epoch", "cosine_step", "constant")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation and evaluation settings of one run. Defaults follow the MAD protocol.

    Fields:
        epochs / steps: length of training; at least one is set (``steps`` cycles over reshuffled epochs). With
            both, the run is the first ``steps`` steps of the ``epochs`` run, learning rates included (a prefix,
            e.g. the quick MAD profile: ``runners.train.schedule``); ``steps`` may not exceed that run's length.
        batch_size, num_train, num_test: rows per step, training rows, test rows.
        lr, min_lr, weight_decay, beta1, beta2: AdamW (weight decay on every parameter, as mad-lab).
        schedule: ``cosine_epoch`` (lr stepped once per epoch, MAD), ``cosine_step`` or ``constant``; the cosine
            decays from lr to min_lr; ``warmup_steps`` of linear warmup precede it.
        eval_every: evaluate every this many steps; 0 = once per epoch (and at the end of a ``steps`` run).
        early_stop_acc: stop once the test macro accuracy is strictly above this (MAD: 0.999, as mad-lab); 1 or
            None = never.
        data_seed, init_seed: seeds of the data and of the model initialisation and shuffling.
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
        precision: ``auto`` (bf16 autocast on CUDA, fp32 on the CPU), ``fp32`` or ``bf16``.
        eval_batch_size: rows per evaluation batch.
    """

    epochs: PositiveInt | None = 200
    steps: PositiveInt | None = None
    batch_size: PositiveInt = 128
    num_train: PositiveInt = 12800
    num_test: PositiveInt = 1280
    lr: PositiveFloat = 5e-4
    min_lr: NonNegativeFloat = 1e-6
    weight_decay: NonNegativeFloat = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    schedule: Literal[SCHEDULES] = "cosine_epoch"
    warmup_steps: NonNegativeInt = 0
    eval_every: NonNegativeInt = 0
    early_stop_acc: float | None = None
    data_seed: NonNegativeInt = 0
    init_seed: NonNegativeInt = 0
    device: Literal[DEVICES] = "auto"
    precision: Literal[PRECISIONS] = "auto"
    eval_batch_size: PositiveInt = 256

    def __post_init__(self) -> None:
        check_dataclass(self, keep_ints=True)  # an int in a float field stays an int: config_hash sees it
        if self.epochs is None and self.steps is None:
            raise ValueError("set epochs or steps (or both: the first steps of the epochs run), got neither")
        full = None if self.epochs is None else self.epochs * math.ceil(self.num_train / self.batch_size)
        if full is not None and self.steps is not None and self.steps > full:
            raise ValueError(f"steps={self.steps} exceeds the {full} steps of epochs={self.epochs}, of which a run "
                             f"with both is the first steps")
        if self.min_lr > self.lr:
            raise ValueError(f"need min_lr <= lr, got lr={self.lr} min_lr={self.min_lr}")
        if self.early_stop_acc is not None and not 0 < self.early_stop_acc <= 1:
            raise ValueError(f"early_stop_acc must be in (0, 1], got {self.early_stop_acc}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that defines a run; saved whole in its record and enough to repeat it.

    ``model`` holds ModelConfig fields; those the task fixes (vocab_size, max_seq_len, objective) may be left out
    and must agree when set (``runners.train.resolved.resolve``). ``task_params`` are the task's parameters
    (defaults filled in).
    """

    task: str
    task_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "task_params": dict(self.task_params), "model": dict(self.model),
                "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Inverse of ``to_dict``; unknown keys at any level raise ValueError naming them."""
        data = check_mapping("RunConfig", data)
        train = from_mapping(TrainConfig, data.get("train", {}), where="RunConfig.train")
        return from_mapping(cls, {**data, "train": train})


def config_hash(config: RunConfig) -> str:
    """12 hex digits identifying a run by its full config (key order does not matter)."""
    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
