"""What defines a run: its training settings (``TrainConfig``), the whole run (``RunConfig``), the task and model
config it resolves to, and the hash that names it.

Configs are typed dataclasses that refuse unknown keys. ``config_hash`` names a run by its whole config: sweeps
find a run's record by it, so the same config must keep giving the same hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from mixlab import models, tasks

SCHEDULES = ("cosine_epoch", "cosine_step", "constant")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation and evaluation settings of one run. Defaults follow the MAD protocol.

    Fields:
        epochs / steps: length of training; exactly one is set (``steps`` cycles over reshuffled epochs).
        batch_size, num_train, num_test: rows per step, training rows, test rows.
        lr, min_lr, weight_decay, beta1, beta2: AdamW (weight decay on every parameter, as mad-lab).
        schedule: ``cosine_epoch`` (lr stepped once per epoch, MAD), ``cosine_step`` or ``constant``; the cosine
            decays from lr to min_lr; ``warmup_steps`` of linear warmup precede it.
        eval_every: evaluate every this many steps; 0 = once per epoch (and at the end of a ``steps`` run).
        early_stop_acc: stop once the test macro accuracy reaches this (MAD: 0.999); None = never.
        data_seed, init_seed: seeds of the data and of the model initialisation and shuffling.
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
        precision: ``auto`` (bf16 autocast on CUDA, fp32 on the CPU), ``fp32`` or ``bf16``.
        eval_batch_size: rows per evaluation batch.
    """

    epochs: int | None = 200
    steps: int | None = None
    batch_size: int = 128
    num_train: int = 12800
    num_test: int = 1280
    lr: float = 5e-4
    min_lr: float = 1e-6
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    schedule: str = "cosine_epoch"
    warmup_steps: int = 0
    eval_every: int = 0
    early_stop_acc: float | None = None
    data_seed: int = 0
    init_seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    eval_batch_size: int = 256

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError(f"set exactly one of epochs and steps, got epochs={self.epochs} steps={self.steps}")
        for name in ("epochs", "steps", "batch_size", "num_train", "num_test", "eval_batch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "eval_every", "data_seed", "init_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not self.lr > 0 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr} min_lr={self.min_lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.early_stop_acc is not None and not 0 < self.early_stop_acc <= 1:
            raise ValueError(f"early_stop_acc must be in (0, 1], got {self.early_stop_acc}")
        for name, value, choices in [("schedule", self.schedule, SCHEDULES), ("device", self.device, DEVICES),
                                     ("precision", self.precision, PRECISIONS)]:
            if value not in choices:
                raise ValueError(f"unknown {name} {value!r}; choose from {', '.join(choices)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that defines a run; saved whole in its record and enough to repeat it.

    ``model`` holds ModelConfig fields other than those the task fixes (vocab_size, max_seq_len, and the
    objective of the compression task); ``task_params`` are the task's parameters (defaults filled in).
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
        unknown = sorted(set(data) - {"task", "task_params", "model", "train"})
        if unknown:
            raise ValueError(f"unknown run config keys {unknown}")
        train = dict(data.get("train", {}))
        train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
        bad = sorted(set(train) - train_fields)
        if bad:
            raise ValueError(f"unknown train config keys {bad}")
        return cls(task=data["task"], task_params=dict(data.get("task_params", {})),
                   model=dict(data.get("model", {})), train=TrainConfig(**train))


def resolve(config: RunConfig) -> tuple[tasks.Task, models.ModelConfig]:
    """The task and the full model config of a run; raises ValueError on any bad name or value."""
    task = tasks.get_task(config.task, **config.task_params)
    fixed = {"vocab_size": task.vocab_size, "max_seq_len": task.generate(1, seed=0).seq_len}
    if config.task == "mad/compression":
        fixed["objective"] = "compression"
    clash = sorted(k for k in set(config.model) & set(fixed) if config.model[k] != fixed[k])
    if clash:
        raise ValueError(f"model fields {clash} are set by the task {config.task!r}")
    return task, models.ModelConfig.from_dict({**config.model, **fixed})


def config_hash(config: RunConfig) -> str:
    """12 hex digits identifying a run by its full config (key order does not matter)."""
    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
