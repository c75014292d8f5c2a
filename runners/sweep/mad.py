"""The MAD protocol (docs/mad.md) as a sweep: 66 settings x lr x wd grid x seeds for one model.

Every run: the model (a preset of ``models.PRESETS``, any ``models.MIXERS`` name or a hybrid pattern such as
``static_conv,attention``, ``models.layer_mixers``, on the MAD model: 2 blocks, width 128, SwiGLU 352,
initialised and biased as mad-lab's models: ``MAD_LAB_MODEL``), AdamW on every parameter, batch 128, cosine per
epoch from lr to 1e-6, no warmup, bf16 autocast on a GPU, evaluation after every epoch on 1,280 test rows in
batches of 128 (macro accuracy is averaged per batch, so the batch size moves it), early stop at macro accuracy
strictly above 0.999. A record's ``final`` metrics come from the epoch with the lowest test perplexity (the mean
of per-batch perplexities, ``runners.train.record``). Scoring (``analysis.aggregate``): best macro accuracy of the
lr x wd grid per (setting, seed), mean over a task's settings, mean of the six tasks; tables give the median and
IQR over seeds.

Seeds: mad-lab trains one seed. Seed s here sets both ``data_seed`` and ``init_seed`` to s, so the spread
over seeds covers the draw of the data as well as initialisation and shuffling (the whole experiment
repeated). All grid points of one (setting, seed) see the same data and the same initial weights, so
best-of-grid compares like with like. Seed 0 alone is the one-seed protocol.

Profiles (what each reduces; ``paper`` is the full protocol):

=======  ===========  ================  ==============================  =============  ===========
profile  settings     lr x wd grid      epochs per run                  train / test   model
=======  ===========  ================  ==============================  =============  ===========
paper    all 66       {1e-4,5e-4,1e-3}  200                             as MAD / 1280  MAD
                      x {0, 0.1}
quick    all 66       1e-3 x 0          the first min(200, ceil(1500 /  as MAD / 1280  MAD
                                        steps per epoch)) of 200: 15
                                        at 12,800 rows, 200 for
                                        memorization
smoke    6 baselines  1e-3 x {0, 0.1}   2                               <=64 / 64      d_model 32,
                                                                                       4 heads
=======  ===========  ================  ==============================  =============  ===========

Sizes for one architecture and one seed, before early stopping (``MadProfile.max_total_steps``): ``paper``
396 runs, 5.38M optimizer steps, about 12 GPU-hours one run at a time at 7.9 ms per step (H200, docs/engine.md);
``quick`` 66 runs, 91,940 steps, about 12 GPU-minutes plus evaluation: it fits one 30-minute GPU lease one
run at a time; ``smoke`` 12 runs of 2 steps of 64 rows, well under a CPU minute for a transformer. ``quick``
keeps every setting because the MAD score averages over them (long sequences and small training sets are the
hard ones); it drops the grid and caps the steps instead. A quick run is the first epochs of the paper run
with the same lr and wd, at the paper run's learning rate at every step (the cosine still spans 200 epochs), so
its curve is the start of the paper's, not a compressed copy of it; where the cap reaches 200 epochs
(memorization) it is the paper run, hash included.

The MAD step is launch-bound (the GPU is mostly idle), so ``run_sweep`` trains runs of equal step shapes stacked,
one batched job each (``runners.train.engine``): a setting's lr x wd grid and its seeds, and settings that differ
only in values (noisy recall's ``frac_noise``) or in training-set size, each run on its own plan and each row of
a stack refilled from the job's queue as its run stops; ``--workers`` overlaps jobs and ``--backend ray`` spreads
them over machines.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from mixlab import models
from mixlab.core.fields import NonNegativeFloat, PositiveFloat, PositiveInt, check_dataclass
from mixlab.runners.sweep.plan import PlannedRun, Resolver, SweepPlan, parse_seeds
from mixlab.tasks.mad import MadSetting, mad_sweep_settings
from mixlab.tasks.mad.sweep import MAD_LAB_PARAMS

LRS = (1e-4, 5e-4, 1e-3)
WEIGHT_DECAYS = (0.0, 0.1)
BATCH_SIZE = 128
MAX_EPOCHS = 200
MIN_LR = 1e-6
EARLY_STOP_ACC = 0.999
NUM_TEST = 1280
# ModelConfig fields that make a model initialised and biased as mad-lab's models were when the MAD paper's
# results were made (its commits of 2024-03): biases on attention's projections and the output layer, every Linear
# weight N(0, 0.02) (init="normal", the default) in the language model and the compression autoencoder alike.
# From its commit 756b19f (2024-12-05) on, mad-lab's language model keeps PyTorch's default Linear init instead
# (init="torch_linear"); runners/sweep/presets/mad_init_ab.yaml compares the three.
MAD_LAB_MODEL = {"proj_bias": True}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MadProfile:
    """How much of the protocol to run.

    baselines_only: keep only each task's baseline setting (else all 66).
    lrs, weight_decays: the grid.
    max_steps: per-run cap on optimizer steps; a run trains the first min(max_epochs, ceil(max_steps / steps
        per epoch)) epochs of the max_epochs run, at that run's learning rates (its cosine still spans
        max_epochs), so a capped run is a prefix of the uncapped one. None = no cap.
    max_train: cap on training rows (None = the setting's). num_test: test rows.
    model: ModelConfig fields over the chosen model's (e.g. a smaller width).
    seeds: default number of seeds.
    """

    name: str
    summary: str
    baselines_only: bool = False
    lrs: tuple[PositiveFloat, ...] = LRS
    weight_decays: tuple[NonNegativeFloat, ...] = WEIGHT_DECAYS
    max_epochs: PositiveInt = MAX_EPOCHS
    max_steps: PositiveInt | None = None
    max_train: PositiveInt | None = None
    num_test: PositiveInt = NUM_TEST
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: PositiveInt = 1

    def __post_init__(self) -> None:
        check_dataclass(self, keep_ints=True)  # lrs and weight decays stay as written: run hashes see them

    def settings(self) -> list[MadSetting]:
        settings = mad_sweep_settings()
        return [s for s in settings if s.label == "baseline"] if self.baselines_only else settings

    def num_train(self, setting: MadSetting) -> int:
        return setting.num_train if self.max_train is None else min(setting.num_train, self.max_train)

    def epochs(self, setting: MadSetting) -> int:
        """Epochs a run of this setting trains."""
        if self.max_steps is None:
            return self.max_epochs
        return min(self.max_epochs, math.ceil(self.max_steps / self.steps_per_epoch(setting)))

    def steps_per_epoch(self, setting: MadSetting) -> int:
        return math.ceil(self.num_train(setting) / BATCH_SIZE)

    def length(self, setting: MadSetting) -> dict[str, int | None]:
        """TrainConfig's epochs and steps of a run: the max_epochs schedule, cut after ``epochs`` epochs (steps
        None when the run is the whole schedule, so it is the uncapped run itself, hash included)."""
        epochs = self.epochs(setting)
        return {"epochs": self.max_epochs,
                "steps": None if epochs == self.max_epochs else epochs * self.steps_per_epoch(setting)}

    def max_total_steps(self) -> int:
        """Optimizer steps of one seed if no run stops early."""
        grid = len(self.lrs) * len(self.weight_decays)
        return grid * sum(self.epochs(s) * self.steps_per_epoch(s) for s in self.settings())

    def describe(self) -> str:
        """One paragraph for the top of a table: what this profile runs."""
        n = len(self.settings())
        grid = len(self.lrs) * len(self.weight_decays)
        lrs = ",".join(f"{v:g}" for v in self.lrs)
        wds = ",".join(f"{v:g}" for v in self.weight_decays)
        return (f"profile {self.name}: {self.summary}. {n} settings x lr {{{lrs}}} x wd {{{wds}}} = "
                f"{n * grid} runs per seed, at most {self.max_total_steps():,} optimizer steps per seed.")


PROFILES: dict[str, MadProfile] = {
    "paper": MadProfile(name="paper", summary="the full MAD protocol (200 epochs, 6-point grid)"),
    "quick": MadProfile(
        name="quick",
        summary="all 66 settings, one grid point (lr 1e-3, wd 0), the first ~1,500 steps of each 200-epoch run",
        lrs=(1e-3,), weight_decays=(0.0,), max_steps=1500,
    ),
    "smoke": MadProfile(
        name="smoke",
        summary="CPU check: 6 baselines, <=64 train / 64 test rows, 2 epochs, d_model 32",
        baselines_only=True, lrs=(1e-3,), max_epochs=2, max_train=64, num_test=64,
        model={"d_model": 32, "n_heads": 4, "mlp_hidden": 88},
    ),
}


def model_names() -> list[str]:
    """Models ``mad run`` accepts by name: every preset of models.PRESETS, then every mixer (built-in, then
    installed plugins); an import path ``package.module:Factory`` is accepted too."""
    return sorted(models.PRESETS) + [m for m in models.mixer_origins() if m not in models.PRESETS]


def model_fields(name: str) -> dict[str, Any]:
    """ModelConfig fields of a model name (a preset wins over a mixer of the same name)."""
    if name in models.PRESETS:
        return dict(models.PRESETS[name])
    origins = models.mixer_origins()
    if all(part in origins or ":" in part for part in models.mixer_pattern(name)):
        models.pattern_classes(name)  # an import path that does not import fails here, in one line
        return {"mixer": name}
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(model_names())} "
                     f"or an import path package.module:Factory")


def get_profile(name: str) -> MadProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    return PROFILES[name]


def default_out(model: str, profile: str) -> Path:
    return Path("runs") / "mad" / f"{model}-{profile}"


def mad_plan(model: str, profile: str = "paper", *, seeds: int | None = None,
             device: str = "auto") -> SweepPlan:
    """Every run of the MAD protocol for one model and profile; seeds 0..seeds-1 (default: the profile's).

    Each run's labels: task, setting (the MAD variation, e.g. ``seq_len=512``), model, train_grid (lr,
    weight_decay), seed. Raises ValueError for an unknown model or profile or a bad seed count.
    """
    prof = get_profile(profile)
    base = model_fields(model)
    seed_list = parse_seeds(prof.seeds if seeds is None else seeds)
    fields = {**base, **prof.model}
    resolver = Resolver()
    runs = []
    # Seeds outermost, so a stopped sweep has whole grids for its first seeds.
    for seed in seed_list:
        for setting in prof.settings():
            for lr in prof.lrs:
                for wd in prof.weight_decays:
                    train = {**prof.length(setting), "batch_size": BATCH_SIZE,
                             "num_train": prof.num_train(setting), "num_test": prof.num_test, "lr": lr,
                             "min_lr": MIN_LR, "weight_decay": wd, "schedule": "cosine_epoch",
                             "early_stop_acc": EARLY_STOP_ACC, "data_seed": seed, "init_seed": seed,
                             "device": device, "eval_batch_size": BATCH_SIZE}
                    run = resolver.run(setting.task, setting.params, {**MAD_LAB_MODEL, **fields}, train)
                    meta = {"task": setting.task, "setting": setting.label, "model": model, "model_grid": {},
                            "train_grid": {"lr": lr, "weight_decay": wd}, "seed": seed}
                    runs.append(PlannedRun(run, meta))
    # What mad-lab's code fixes beyond the model and profile: part of the sweep's identity, so a folder of runs
    # planned under other rules is refused rather than mixed with these (runners.sweep.manifest).
    mad_lab = {"model": MAD_LAB_MODEL,
               "task_params": {cls.name: params for cls, params in MAD_LAB_PARAMS.items()},
               "eval_batch_size": BATCH_SIZE, "early_stop": "strictly above", "capped_runs": "prefix"}
    spec = {"protocol": "mad", "model": model, "model_fields": base, "mad_lab": mad_lab,
            "profile": dataclasses.asdict(prof),
            "profile_text": prof.describe(), "device": device, "seeds": list(seed_list),
            "metric": "acc_macro"}
    return SweepPlan(name=f"mad-{model}-{profile}", kind="mad", spec=spec, runs=runs)
