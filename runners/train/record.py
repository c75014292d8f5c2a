"""A run's JSON record, gathered while it trains, alike for a run trained alone and one of a stack.

Both rules are mad-lab's, here once for train_run and the stacked engine. The record's ``final`` metrics are
those of the evaluation with the lowest ``test_ppl`` (the mean of per-batch perplexities, ``runners.train.metrics``:
what mad-lab's best checkpoint monitors), the first on ties, with its ``best_step`` and ``best_epoch``;
``history`` holds every evaluation. A run stops early once its test macro accuracy is strictly above
``early_stop_acc`` (Lightning's ``EarlyStopping`` with ``stopping_threshold``, mode max, compares with >).
Training time is read at evaluations only, after a device sync (no per-step sync), and leaves the evaluations
out; ``wall_time_s`` includes them.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch
from mixlab.core.atomic import write_json_atomic
from mixlab.runners.train.provenance import device_info, package_versions
from mixlab.runners.train.resolved import ResolvedRun


@dataclasses.dataclass(eq=False, kw_only=True)
class RunLog:
    """What a run's record says about it: the run (resolved, and the caller's name) and what it did (its
    evaluations, the best one, whether it stopped early, its training time)."""

    resolved: ResolvedRun
    name: str | None = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best: dict[str, Any] | None = None
    stopped_early: bool = False
    train_time: float = 0.0

    def add_evaluation(self, metrics: dict[str, float], *, epoch: int, step: int, lr: float, loss_sum: float,
                       loss_steps: int) -> bool:
        """Log the evaluation after ``step`` steps, taken in ``epoch`` (0-based) at learning rate ``lr``, with
        the training loss summed over the ``loss_steps`` steps since the last one; decide the early stop.
        Returns whether it is the best evaluation so far."""
        entry = {"epoch": epoch + 1, "step": step, "lr": lr, "train_loss": loss_sum / max(loss_steps, 1),
                 **metrics}
        self.history.append(entry)
        improved = self.best is None or entry["test_ppl"] < self.best["test_ppl"]
        if improved:
            self.best = entry
        stop = self.resolved.config.train.early_stop_acc
        self.stopped_early = stop is not None and entry["acc_macro"] > stop
        return improved

    def default_name(self) -> str:
        """The caller's name, else ``<task>_<mixer>_<config_hash>``."""
        task = self.resolved.config.task.replace("/", "-")
        return self.name or f"{task}_{self.resolved.model_config.mixer}_{self.resolved.hash}"

    def state_dict(self) -> dict[str, Any]:
        """What the log holds so far, with the run's name and config, for a checkpoint (``runners.train.resume``);
        ``best`` is an index into ``history``."""
        best = next(i for i, entry in enumerate(self.history) if entry is self.best) if self.best is not None else None
        return {"name": self.default_name(), "config": self.resolved.config.to_dict(), "history": self.history,
                "best": best, "stopped_early": self.stopped_early, "train_time": self.train_time}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what ``state_dict`` gave (other keys are the loop's)."""
        self.history = list(state["history"])
        self.best = None if state["best"] is None else self.history[state["best"]]
        self.stopped_early, self.train_time = state["stopped_early"], state["train_time"]

    def record(self, *, n_params: int, device: torch.device, steps: int, start_wall: float,
               named: bool) -> dict[str, Any]:
        """The record after ``steps`` steps of a loop started at ``time.perf_counter()`` = ``start_wall``; named
        (``default_name``) for a file when ``named``, else it keeps the caller's name (maybe None)."""
        run, best = self.resolved, self.best
        tc = run.config.train
        return {
            "name": self.default_name() if named else self.name,
            "config": run.config.to_dict(),
            "resolved": {"task_params": dataclasses.asdict(run.task.params), "model": run.model_config.to_dict()},
            "versions": package_versions(run.model_config),
            "device": device_info(device),
            "seeds": {"data_seed": tc.data_seed, "init_seed": tc.init_seed},
            "n_params": n_params,
            "history": self.history,
            "final": {**best, "best_step": best["step"], "best_epoch": best["epoch"]},
            "steps": steps,
            "stopped_early": self.stopped_early,
            "wall_time_s": time.perf_counter() - start_wall,
            "train_time_s": self.train_time,
            "steps_per_s": steps / self.train_time if self.train_time > 0 else float("nan"),
            "argv": sys.argv,
        }


def write_record(out_dir: str | Path, record: dict[str, Any]) -> None:
    """``<out_dir>/<name>.json``, atomically."""
    write_json_atomic(Path(out_dir) / f"{record['name']}.json", record)


class TrainClock:
    """Training time between evaluations: ``lap`` waits for the device's queued work, then reads the seconds
    since the clock started or last ``restart`` (called after an evaluation, so evaluations are left out)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = time.perf_counter()

    def lap(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.start

    def restart(self) -> None:
        self.start = time.perf_counter()
