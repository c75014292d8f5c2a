"""The 66 settings of the MAD difficulty sweep (docs/mad.md; mad-lab ``configs/tasks/*.yml``).

Each task has a baseline (its ``Params`` defaults with ``MAD_LAB_PARAMS`` on top, 12,800 training rows, 256 for
memorization) and variations that change one thing at a time: a task parameter or the number of training rows.
The test set is always 1,280 rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mixlab.tasks.mad.compression import Compression
from mixlab.tasks.mad.fuzzy_recall import FuzzyRecall
from mixlab.tasks.mad.in_context_recall import InContextRecall
from mixlab.tasks.mad.memorization import Memorization
from mixlab.tasks.mad.noisy_recall import NoisyRecall
from mixlab.tasks.mad.selective_copy import SelectiveCopy

NUM_TEST = 1280
_TRAIN_SIZES = (6400, 3200, 1600, 800)

# (task class, baseline num_train, {parameter or "num_train": variations}), in MAD_TASKS order.
_SWEEP = [
    (InContextRecall, 12800, {"vocab_size": (32, 64, 128), "seq_len": (256, 512, 1024), "num_train": _TRAIN_SIZES}),
    (
        NoisyRecall,
        12800,
        {
            "vocab_size": (48, 80, 144),  # 16 noise tokens on top of 32/64/128 keys and values
            "seq_len": (256, 512, 1024),
            "num_train": _TRAIN_SIZES,
            "frac_noise": (0.4, 0.6, 0.8),
        },
    ),
    (FuzzyRecall, 12800, {"vocab_size": (32, 64, 128), "seq_len": (256, 512, 1024), "num_train": _TRAIN_SIZES}),
    (
        SelectiveCopy,
        12800,
        {
            "vocab_size": (32, 64, 128),
            "seq_len": (512, 1024),
            "num_train": _TRAIN_SIZES,
            "num_tokens_to_copy": (32, 64, 96),
        },
    ),
    (Compression, 12800, {"vocab_size": (32, 64, 128), "seq_len": (64, 128, 256), "num_train": _TRAIN_SIZES}),
    (Memorization, 256, {"vocab_size": (512, 1024, 2048, 4096, 8192)}),
]


# Parameters over a task's defaults in every setting, so the generators behave as mad-lab's: its fuzzy recall
# can place the probe past the last pair (a few per cent of rows then ask for a key never shown). Selective copy
# honours num_tokens_to_copy, as mad-lab's generator does since commit 35772e8; ``ignore_num_tokens_to_copy``
# gives the earlier variant, which the report scores too (docs/mad.md weighs which one the paper's data held).
MAD_LAB_PARAMS = {FuzzyRecall: {"probe_anywhere": True}}


@dataclass(frozen=True, kw_only=True)
class MadSetting:
    """One sweep setting: build it with ``get_task(setting.task, **setting.params)``.

    ``params`` holds every task parameter (baseline values with the variation applied); ``label`` names the
    variation, e.g. ``"vocab_size=32"``, ``"num_train=800"`` or ``"baseline"``.
    """

    task: str
    params: dict[str, Any]
    num_train: int
    num_test: int = NUM_TEST
    label: str


def mad_sweep_settings() -> list[MadSetting]:
    """All 66 settings: per task the baseline, then each variation in the order of mad-lab's configs."""
    settings = []
    for cls, num_train, variations in _SWEEP:
        baseline = {**cls.defaults(), **MAD_LAB_PARAMS.get(cls, {})}
        settings.append(MadSetting(task=cls.name, params=dict(baseline), num_train=num_train, label="baseline"))
        for key, values in variations.items():
            for value in values:
                if key == "num_train":
                    params, rows = dict(baseline), value
                else:
                    params, rows = {**baseline, key: value}, num_train
                settings.append(MadSetting(task=cls.name, params=params, num_train=rows, label=f"{key}={value}"))
    return settings
