"""A run's step plan and learning-rate schedule, shared by the one-run loop and the stacked engine.

A run of ``epochs`` takes ``epochs * steps_per_epoch`` steps; a run of ``steps`` cycles over reshuffled epochs
and may stop inside its last one. With both set, the run is the first ``steps`` steps of the ``epochs`` run: its
learning rate at every step is that run's (the schedule spans the ``epochs``), and it stops after ``steps``.
Each epoch draws one permutation of the training rows and walks it in batches of ``batch_size`` (the last batch
of an epoch may be short). The run evaluates every ``eval_every`` steps (0 in the config: once per epoch) and
after its last step.
"""

from __future__ import annotations

import dataclasses
import math

from mixlab.runners.train.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Which steps a run takes and after which it evaluates (module docstring)."""

    batch_size: int
    num_train: int
    steps_per_epoch: int
    total_steps: int  # the steps this run takes
    total_epochs: int  # the epochs it takes, its last maybe cut short
    schedule_steps: int  # the steps and epochs its learning-rate schedule spans (more for a prefix run)
    schedule_epochs: int
    eval_every: int

    @classmethod
    def of(cls, train: TrainConfig) -> StepPlan:
        steps_per_epoch = math.ceil(train.num_train / train.batch_size)
        schedule_steps = train.epochs * steps_per_epoch if train.epochs is not None else train.steps
        total_steps = train.steps if train.steps is not None else schedule_steps
        return cls(batch_size=train.batch_size, num_train=train.num_train, steps_per_epoch=steps_per_epoch,
                   total_steps=total_steps, total_epochs=math.ceil(total_steps / steps_per_epoch),
                   schedule_steps=schedule_steps, schedule_epochs=math.ceil(schedule_steps / steps_per_epoch),
                   eval_every=train.eval_every or steps_per_epoch)

    def epoch_of(self, step: int) -> int:
        """The epoch (0-based) that optimizer step ``step`` (0-based) belongs to."""
        return step // self.steps_per_epoch

    def steps_from(self, step: int) -> int:
        """How many steps the epoch that starts at ``step`` takes: all of it, or what is left of the run."""
        return min(self.steps_per_epoch, self.total_steps - step)

    def batch(self, i: int) -> slice:
        """The positions in its epoch's permutation of the rows that step ``i`` of the epoch trains on."""
        return slice(i * self.batch_size, (i + 1) * self.batch_size)

    def batch_rows(self, step: int) -> int:
        """How many rows optimizer step ``step`` (0-based) trains on: ``batch_size``, or what its epoch has left."""
        return min(self.batch_size, self.num_train - (step % self.steps_per_epoch) * self.batch_size)

    @property
    def rows_trained(self) -> int:
        """Training rows its steps go through if it never stops early: whole epochs of ``num_train`` rows, then
        full batches of the last one."""
        epochs, steps = divmod(self.total_steps, self.steps_per_epoch)
        return epochs * self.num_train + min(steps * self.batch_size, self.num_train)

    def evaluates_after(self, steps_done: int) -> bool:
        return steps_done % self.eval_every == 0 or steps_done == self.total_steps

    def lr(self, train: TrainConfig, step: int) -> float:
        """``lr_at`` for optimizer step ``step`` (0-based) of this plan."""
        return lr_at(train, step, self.epoch_of(step), self.schedule_steps, self.schedule_epochs)


def lr_at(train: TrainConfig, step: int, epoch: int, total_steps: int, total_epochs: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based) taken during ``epoch`` (0-based): linear warmup over
    ``warmup_steps``, then ``schedule``: constant, or a cosine from lr to min_lr over the epochs
    (``cosine_epoch``, stepped once per epoch) or over the steps after the warmup (``cosine_step``)."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.schedule == "constant":
        return train.lr
    if train.schedule == "cosine_epoch":
        progress = epoch / max(total_epochs, 1)
    else:
        progress = (step - train.warmup_steps) / max(total_steps - train.warmup_steps, 1)
    return train.min_lr + (train.lr - train.min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
