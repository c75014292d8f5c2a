"""One training run: a task, a model, AdamW, evaluation every epoch, one JSON record written atomically.

The reported metrics come from the evaluation with the lowest test perplexity (mad-lab's rule). Data and model
initialisation have separate seeds: ``data_seed`` generates the train and test sets, ``init_seed`` seeds the model's
initialisation and the shuffling of the training set. Nothing here reads or changes the caller's global RNG state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mixlab import models, tasks
from mixlab.runners.metrics import EvalSums, scored_view
from tqdm.auto import tqdm

SCHEDULES = ("cosine_epoch", "cosine_step", "constant")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation and evaluation settings of one run. Defaults follow the MAD protocol (SPEC 3.3).

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


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(name)


def lr_at(train: TrainConfig, step: int, epoch: int, total_steps: int, total_epochs: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based) taken during ``epoch`` (0-based)."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.schedule == "constant":
        return train.lr
    if train.schedule == "cosine_epoch":
        progress = epoch / max(total_epochs, 1)
    else:
        progress = (step - train.warmup_steps) / max(total_steps - train.warmup_steps, 1)
    return train.min_lr + (train.lr - train.min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for name in ("triton", "mixlab"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:  # noqa: BLE001 - a missing optional package is recorded as absent
            versions[name] = "absent"
    return versions


def device_info(device: torch.device) -> dict[str, Any]:
    info = {"type": device.type, "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


def write_json_atomic(path: Path, record: Mapping[str, Any]) -> None:
    """Write to a temporary file in the same folder, fsync, then rename: a reader sees all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: tasks.TaskData, batch_size: int, device: torch.device,
             autocast: bool, task: tasks.Task | None = None) -> dict[str, float]:
    """Test loss, perplexity, micro accuracy and macro accuracy (per batch, averaged over batches, as mad-lab),
    plus ``acc_<group>`` and ``n_<group>`` for each of the task's score groups (e.g. present / absent queries)."""
    model.eval()
    sums = EvalSums(task)
    # as in training, sparse tasks get logits at the scored positions only: same counts, a fraction of the memory
    positions, all_targets = scored_view(data.targets)
    for start in range(0, len(data), batch_size):
        rows = slice(start, start + batch_size)
        inputs, targets = data.inputs[rows].to(device), all_targets[rows].to(device)
        doc_ids = None if data.doc_ids is None else data.doc_ids[rows].to(device)
        at = None if positions is None else positions[rows].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(inputs, doc_ids=doc_ids, positions=at)  # [B, T or S, V]
        sums.add(logits, targets)
    model.train()
    return sums.metrics()


def train_run(config: RunConfig, *, out_dir: str | Path | None = None, progress: bool = True,
              run_name: str | None = None, save: bool = False) -> dict[str, Any]:
    """Train one run and return its record; with ``out_dir`` also write ``<out_dir>/<run_name>.json``.

    ``save`` (needs ``out_dir``) also writes the model to ``<out_dir>/<run_name>.pt`` (``models.save``): the
    weights of the evaluation the record's ``final`` metrics come from (the lowest test perplexity), not those
    after the last step, with the run's config, resolved parameters, versions and final metrics as metadata.
    The record then names the file under ``checkpoint``; the checkpoint is written before the record.
    """
    if save and out_dir is None:
        raise ValueError("save=True needs an out_dir to write the checkpoint to")
    tc = config.train
    task, model_config = resolve(config)
    device = pick_device(tc.device)
    autocast = tc.precision == "bf16" or (tc.precision == "auto" and device.type == "cuda")

    train_data = task.generate(tc.num_train, seed=tc.data_seed, split="train")
    test_data = task.generate(tc.num_test, seed=tc.data_seed, split="test")

    # Model init and shuffling draw from init_seed inside a forked RNG, leaving the caller's state alone.
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices, device_type=device.type if fork_devices else "cuda"):
        torch.manual_seed(tc.init_seed)
        model = models.build_model(model_config).to(device)
    shuffle = torch.Generator().manual_seed(tc.init_seed + 1)
    n_params = models.count_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(tc.beta1, tc.beta2),
                                  weight_decay=tc.weight_decay)

    steps_per_epoch = math.ceil(tc.num_train / tc.batch_size)
    total_steps = tc.steps if tc.steps is not None else tc.epochs * steps_per_epoch
    total_epochs = tc.epochs if tc.epochs is not None else math.ceil(total_steps / steps_per_epoch)
    eval_every = tc.eval_every or steps_per_epoch

    history: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    best_state: dict[str, torch.Tensor] | None = None  # weights at `best`, kept only when saving
    stopped_early = False
    step = 0
    train_time = 0.0
    start_wall = time.perf_counter()
    bar = tqdm(total=total_steps, disable=not progress, desc=f"{config.task} {model_config.mixer}",
               unit="step", dynamic_ncols=True, leave=False)
    loss_acc = torch.zeros((), device=device)
    loss_count = 0
    # sparse tasks: the head and the loss see only each row's scored positions (runners.metrics)
    train_positions, train_targets = scored_view(train_data.targets)  # [N, S] each, or None and [N, T]
    # the training set lives on the device: a step indexes it there, with no copy from pageable host memory
    # (each such copy waits for the GPU, like a sync)
    train_inputs, train_targets = train_data.inputs.to(device), train_targets.to(device)
    train_doc_ids = None if train_data.doc_ids is None else train_data.doc_ids.to(device)
    train_positions = None if train_positions is None else train_positions.to(device)
    model.train()
    interval_start = time.perf_counter()  # training time is read at evaluations only: no per-step sync
    try:
        while step < total_steps and not stopped_early:
            epoch = step // steps_per_epoch
            order = torch.randperm(tc.num_train, generator=shuffle).to(device)
            for i in range(steps_per_epoch):
                if step >= total_steps:
                    break
                idx = order[i * tc.batch_size : (i + 1) * tc.batch_size]
                inputs, targets = train_inputs[idx], train_targets[idx]  # [B, T], [B, T or S]
                doc_ids = None if train_doc_ids is None else train_doc_ids[idx]
                positions = None if train_positions is None else train_positions[idx]  # [B, S]
                lr = lr_at(tc, step, epoch, total_steps, total_epochs)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    logits = model(inputs, doc_ids=doc_ids, positions=positions)  # [B, T or S, V]
                loss = torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), targets.flatten(), ignore_index=tasks.IGNORE)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                loss_acc += loss.detach()
                loss_count += 1
                step += 1
                bar.update(1)

                if step % eval_every == 0 or step == total_steps:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    train_time += time.perf_counter() - interval_start
                    metrics = evaluate(model, test_data, tc.eval_batch_size, device, autocast, task)
                    entry = {"epoch": epoch + 1, "step": step, "lr": lr,
                             "train_loss": float(loss_acc) / max(loss_count, 1), **metrics}
                    loss_acc.zero_()
                    loss_count = 0
                    history.append(entry)
                    if best is None or entry["test_ppl"] < best["test_ppl"]:
                        best = entry
                        if save:
                            best_state = {k: v.detach().to("cpu", copy=True)
                                          for k, v in model.state_dict().items()}
                    bar.set_postfix(acc=f"{entry['acc_macro']:.3f}", ppl=f"{entry['test_ppl']:.3g}")
                    interval_start = time.perf_counter()
                    if tc.early_stop_acc is not None and entry["acc_macro"] >= tc.early_stop_acc:
                        stopped_early = True
                        break
    finally:
        bar.close()

    record = {
        "name": run_name,
        "config": config.to_dict(),
        "resolved": {"task_params": dataclasses.asdict(task.params), "model": model_config.to_dict()},
        "versions": package_versions(),
        "device": device_info(device),
        "seeds": {"data_seed": tc.data_seed, "init_seed": tc.init_seed},
        "n_params": n_params,
        "history": history,
        "final": {**best, "best_step": best["step"], "best_epoch": best["epoch"]},
        "steps": step,
        "stopped_early": stopped_early,
        "wall_time_s": time.perf_counter() - start_wall,
        "train_time_s": train_time,
        "steps_per_s": step / train_time if train_time > 0 else float("nan"),
        "argv": sys.argv,
    }
    if out_dir is not None:
        name = run_name or f"{config.task.replace('/', '-')}_{model_config.mixer}_{config_hash(config)}"
        record["name"] = name
        if save:
            record["checkpoint"] = f"{name}.pt"
            metadata = {k: record[k] for k in ("name", "config", "resolved", "versions", "seeds", "final")}
            models.save(model, Path(out_dir) / record["checkpoint"], state_dict=best_state, metadata=metadata)
        write_json_atomic(Path(out_dir) / f"{name}.json", record)
    return record
