"""The learning-rate schedule ``lr_at`` at points whose values are known in closed form: the warmup's ramp, the
cosine's start, middle and end after the warmup, the per-epoch cosine, the constant schedule."""

import math

import pytest
from mixlab.runners.train.config import TrainConfig
from mixlab.runners.train.schedule import lr_at

WARMUP, TOTAL = 10, 110


def step_config(schedule: str, min_lr: float = 0.0) -> TrainConfig:
    return TrainConfig(steps=TOTAL, epochs=None, warmup_steps=WARMUP, schedule=schedule, lr=1.0, min_lr=min_lr)


def test_warmup_ramps_to_the_peak_in_warmup_steps():
    tc = step_config("cosine_step")
    assert [lr_at(tc, s, 0, TOTAL, 1) for s in range(WARMUP)] == pytest.approx([(s + 1) / WARMUP for s in
                                                                                range(WARMUP)])


@pytest.mark.parametrize(("step", "progress"), [(WARMUP, 0.0), (WARMUP + 25, 0.25), (WARMUP + 50, 0.5),
                                                (TOTAL - 1, 0.99)],
                         ids=["first-after-warmup", "quarter", "middle", "last"])
@pytest.mark.parametrize("min_lr", [0.0, 0.2], ids=["to-zero", "to-min_lr"])
def test_cosine_step_runs_over_the_steps_after_the_warmup(step, progress, min_lr):
    expected = min_lr + (1.0 - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
    assert lr_at(step_config("cosine_step", min_lr), step, 0, TOTAL, 1) == pytest.approx(expected)


def test_cosine_epoch_steps_once_per_epoch():
    tc = TrainConfig(epochs=4, lr=1.0, min_lr=0.0, schedule="cosine_epoch")
    per_epoch = [lr_at(tc, step=10 * e + 3, epoch=e, total_steps=40, total_epochs=4) for e in range(4)]
    assert per_epoch == pytest.approx([1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5, 0.5 - 0.5 * math.cos(math.pi / 4)])


def test_constant_keeps_the_peak_after_the_warmup():
    tc = step_config("constant")
    assert [lr_at(tc, s, 0, TOTAL, 1) for s in (WARMUP - 1, WARMUP, TOTAL - 1)] == [1.0, 1.0, 1.0]
