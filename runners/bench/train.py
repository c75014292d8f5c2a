"""``mixlab bench train``: tokens per second and runs per hour, one run at a time against batched.

One run at a time is ``runners.train.run.train_run`` (the baseline is the training loop itself, not a rewrite);
batched is ``runners.train.engine.train_runs_batched`` over ``n_runs`` runs of one setting: the MAD grid's learning
rates and weight decays (docs/mad.md) in turn, seeds 0, 1, ... once the six grid points are used. Every run
trains ``steps`` steps with an evaluation every epoch and at the end, no early stop. A short warm-up call of
each mode first takes one-time costs (CUDA context, cuBLAS, compilation) out of the timings; CUDA graphs are
captured again in the timed call (every new stack captures its own).

Columns: ``setup s`` data generation and model initialisation; ``loop s`` the training loops with their
evaluations (the records' ``wall_time_s``: summed one at a time, the longest when batched); ``train tok/s``
tokens trained per second of pure step time; ``run-steps/s`` optimizer steps of all runs per loop second;
``runs/hour`` that rate divided by the steps of one full run of the setting (``epochs`` x steps per epoch, no
early stop). The correctness gate compares the runs trained alone with the same runs of the batched call:
the largest relative difference of test loss over their histories must stay within ``GATE_BOUND`` of the
precision (eager fp32 on the CPU: bitwise); a mode that fails it gets no speed-up.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from mixlab import kernels, models
from mixlab.core.fields import PositiveInt, check
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.engine import train_runs_batched
from mixlab.runners.train.precision import pick_device, uses_bf16
from mixlab.runners.train.provenance import device_info, package_versions
from mixlab.runners.train.resolved import ResolvedRun, resolve
from mixlab.runners.train.run import train_run
from mixlab.runners.train.speed import LABELS, check_speed, mode_name, stack_modes

# The MAD protocol's grid (docs/mad.md): lr x weight decay.
MAD_GRID = [(lr, wd) for lr in (1e-4, 5e-4, 1e-3) for wd in (0.0, 0.1)]
# Largest relative test-loss difference the correctness gate allows. Eager fp32 on the CPU is bitwise; batched
# GPU kernels and compiled code round differently, and 200 steps amplify that; bf16 autocast more so.
GATE_BOUND = {"exact": 0.0, "fp32": 1e-3, "bf16": 5e-2}
WARMUP_STEPS = 3


def _model_fields(model: str) -> dict[str, Any]:
    if model in models.PRESETS:
        return dict(models.PRESETS[model])
    if model in models.MIXERS:
        return {"mixer": model}
    raise ValueError(f"unknown model {model!r}; choose a preset ({', '.join(models.PRESETS)}) or a mixer "
                     f"({', '.join(models.MIXERS)})")


def kernel_backend_label(model_config: models.ModelConfig) -> str:
    """Which conv kernels the runs call: the model's kernel_backend, else MIXLAB_BACKEND, else auto (Triton on
    CUDA for the ops that have a kernel, including inside stacks; the plain-torch references otherwise)."""
    return model_config.kernel_backend or kernels.utils.env_backend() or "auto"


def bench_runs(task: str, model: str, n_runs: int, steps: int, device: str, *,
               task_params: dict[str, Any] | None = None, model_params: dict[str, Any] | None = None,
               **train: Any) -> list[ResolvedRun]:
    """The benchmark's runs, resolved: the MAD grid in turn, then the next seed (init and data); ``model_params``
    are ModelConfig fields over the model's. A bad task, parameter or model field fails here, before any timing."""
    n_runs = check("n_runs", n_runs, PositiveInt)
    trains = []
    for i in range(n_runs):
        lr, wd = MAD_GRID[i % len(MAD_GRID)]
        seed = i // len(MAD_GRID)
        trains.append(TrainConfig(epochs=None, steps=steps, lr=lr, weight_decay=wd, init_seed=seed, data_seed=seed,
                                  device=device, **train))
    first = resolve(RunConfig(task=task, task_params=dict(task_params or {}),
                              model={**_model_fields(model), **(model_params or {})}, train=trains[0]))
    return [first.with_train(tc) for tc in trains]


def rel_loss_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest relative difference of test loss over two histories (inf when their evaluations differ)."""
    if [h["step"] for h in a["history"]] != [h["step"] for h in b["history"]]:
        return math.inf
    return max(abs(x["test_loss"] - y["test_loss"]) / max(abs(y["test_loss"]), 1e-12)
               for x, y in zip(a["history"], b["history"]))


def gate_text(diff: float, device: torch.device, bf16: bool, *, compiled: bool) -> str:
    """The gate's verdict on a relative test-loss difference: ``bitwise``, the difference, or ``FAILED ...``
    past the bound of the precision (eager fp32 on the CPU must be bitwise)."""
    exact = device.type == "cpu" and not bf16 and not compiled
    text = "bitwise" if diff == 0 else f"{diff:.1e}"
    return text if diff <= GATE_BOUND["exact" if exact else "bf16" if bf16 else "fp32"] else f"FAILED {text}"


def timed(fn) -> tuple[list[dict[str, Any]], float]:
    """(fn's records, seconds it took). Garbage is collected first: a compilation leaves many Python objects, and
    a full collection they trigger (a CPU pause that grows with every graph the process has compiled) would
    otherwise fall into the few timed steps after it rather than spread over a real run's thousands."""
    gc.collect()
    start = time.perf_counter()
    records = fn()
    return records, time.perf_counter() - start


def bench_train(task: str = "mad/in_context_recall", model: str = "transformer", n_runs: int = 6,
                steps: int = 200, device: str = "auto", *, task_params: dict[str, Any] | None = None,
                model_params: dict[str, Any] | None = None, solo_runs: int = 1, speeds: Sequence[str] = (),
                epochs: int = 200, progress: bool = False, **train: Any) -> str:
    """Markdown report: device and versions, then one row for one run at a time (``solo_runs`` of the runs,
    trained by train_run) and one for the ``n_runs`` runs batched eager, then one batched row per speed mode of
    ``speeds`` (``runners.train.speed``; auto's row names the mode it picked). ``train`` sets other TrainConfig fields
    (batch_size, num_train, precision, ...); ``epochs`` is the full run's length that runs/hour refers to.
    ``progress``: the step bars of train_run and of the batched engine on stderr while the benchmark runs (a
    microsecond a step, within the timings' noise)."""
    steps = check("steps", steps, PositiveInt)
    runs = bench_runs(task, model, n_runs, steps, device, task_params=task_params,  # checks n_runs
                      model_params=model_params, **train)
    if check("solo_runs", solo_runs, PositiveInt) > n_runs:
        raise ValueError(f"solo_runs must be in [1, n_runs={n_runs}], got {solo_runs}")
    warm = [run.with_train(dataclasses.replace(run.config.train, steps=min(steps, WARMUP_STEPS))) for run in runs]
    tc = runs[0].config.train
    dev = pick_device(tc.device)
    model_config = runs[0].model_config
    seq_len = runs[0].row_tokens
    bf16 = uses_bf16(tc.precision, dev)
    full_steps = epochs * math.ceil(tc.num_train / tc.batch_size)
    compiles = runs[0].auto_compiles

    modes = [("batched", "eager")]
    for speed in dict.fromkeys(check_speed(s) for s in speeds if s != "eager"):
        picked = mode_name(*stack_modes(speed, dev, seq_len, compiles))
        label = f"auto ({LABELS[picked]})" if speed == "auto" else LABELS[speed]
        modes.append((f"batched, {label}", speed))

    train_run(warm[0], progress=progress)
    solo, solo_total = timed(lambda: [train_run(c, progress=progress) for c in runs[:solo_runs]])
    rows = [_row("one at a time", solo, solo_total, sum(r["wall_time_s"] for r in solo), steps, tc.batch_size,
                 seq_len, full_steps, None, "reference")]
    base_rate = rows[0][1]
    for label, speed in modes:
        train_runs_batched(warm, progress=progress, speed=speed)
        batched, total = timed(lambda s=speed: train_runs_batched(runs, progress=progress, speed=s))
        diff = max(rel_loss_diff(b, a) for b, a in zip(batched, solo))
        gate = gate_text(diff, dev, bf16, compiled=stack_modes(speed, dev, seq_len, compiles)[0])
        loop = max(r["wall_time_s"] for r in batched)
        rows.append(_row(label, batched, total, loop, steps, tc.batch_size, seq_len, full_steps,
                         None if gate.startswith("FAILED") else base_rate, gate))

    info = device_info(dev)
    versions = package_versions(model_config)
    cuda = torch.version.cuda or "none"
    lines = [
        f"# Training throughput: {task} ({seq_len}-token rows), model {model}, "
        f"{model_config.n_layers} blocks, d={model_config.d_model}",
        "",
        f"{datetime.date.today().isoformat()}, device: {info['name']} ({dev.type}), "
        f"torch {versions['torch']}, CUDA {cuda}, triton {versions['triton']}, python {versions['python']}, "
        f"precision {'bf16 autocast' if bf16 else 'fp32'}, kernels {kernel_backend_label(model_config)}",
        f"bench_train(task={task!r}, model={model!r}, n_runs={n_runs}, steps={steps}, device={device!r}, "
        f"task_params={task_params or {}!r}, model_params={model_params or {}!r}, "
        f"solo_runs={solo_runs}, speeds={list(speeds)}, epochs={epochs}"
        + "".join(f", {k}={v!r}" for k, v in train.items()) + ")",
        f"batch {tc.batch_size}, {tc.num_train} training rows, full run = {full_steps} steps",
        "",
        "| mode | runs | setup s | loop s | train tok/s | run-steps/s | runs/hour | speed-up | gate |",
        "|---|---|---|---|---|---|---|---|---|",
        *(row[0] for row in rows),
    ]
    best = max(row[1] for row in rows if "FAILED" not in row[0])
    lines += ["", f"At the best rate ({best:.1f} run-steps/s) the 5.4M optimizer steps of the full MAD "
              f"protocol would take {5.4e6 / best / 60:.0f} minutes, if every step cost what this setting's "
              "does."]
    return "\n".join(lines) + "\n"


def _row(label: str, records: list[dict[str, Any]], total: float, loop: float, steps: int, batch: int,
         seq_len: int, full_steps: int, base_rate: float | None, gate: str) -> tuple[str, float]:
    """(markdown row, run-steps per loop second)."""
    n = len(records)
    train_time = sum(r["train_time_s"] for r in records)
    tokens = n * steps * batch * seq_len
    rate = n * steps / loop
    speedup = f"{rate / base_rate:.1f}x" if base_rate else "-"
    text = (f"| {label} | {n} | {total - loop:.2f} | {loop:.2f} | {tokens / train_time:,.0f} | {rate:.1f} | "
            f"{3600 * rate / full_steps:.1f} | {speedup} | {gate} |")
    return text, rate
