"""One training run: a task, a model, AdamW, evaluation every epoch, one JSON record written atomically.

The run is a ``resolved.ResolvedRun`` (a bare ``config.RunConfig`` is resolved here); what it shares with a run of
a stack (``engine``) lives in one module each of this package: its data, initialisation and shuffling (``seeds``),
its steps, evaluations and learning rates (``schedule``), its precision (``precision``), its evaluation
(``evaluation``) and its record (``record``: the reported metrics come from the evaluation with the lowest test
perplexity). Its checkpoints (``resume``) hold its model's and AdamW's state dicts and its log's.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from mixlab import kernels, models, tasks
from mixlab.core.atomic import writable_folder
from mixlab.core.records import is_record
from mixlab.models import checkpoint
from mixlab.runners.train import resume
from mixlab.runners.train.config import RunConfig
from mixlab.runners.train.evaluation import evaluate
from mixlab.runners.train.metrics import scored_view, training_loss
from mixlab.runners.train.precision import bf16_autocast, pick_device, uses_bf16
from mixlab.runners.train.record import RunLog, TrainClock, write_record
from mixlab.runners.train.resolved import ResolvedRun, as_resolved, resolve
from mixlab.runners.train.schedule import StepPlan
from mixlab.runners.train.seeds import initial_model, run_data, shuffle_generator
from tqdm.auto import tqdm


def train_run(run: ResolvedRun | RunConfig, *, out_dir: str | Path | None = None, progress: bool = True,
              run_name: str | None = None, save: bool = False, checkpoint_every_s: float | None = None,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Train one run (resolved, or its config, which is resolved here) and return its record; with ``out_dir`` also
    write ``<out_dir>/<run_name>.json``.

    ``save`` (needs ``out_dir``) also writes the model to ``<out_dir>/<run_name>.pt`` (``models.save``): the
    weights of the evaluation the record's ``final`` metrics come from (the lowest test perplexity), not those
    after the last step, with the run's config, resolved parameters, versions and final metrics as metadata.
    The record then names the file under ``checkpoint``; the checkpoint is written before the record.
    ``out_dir`` is made and checked (``writable_folder``) before anything trains.

    With ``progress``, one line on stderr says what the run will do before its first step (task, mixer,
    device, epochs, steps, parameters), then a bar counts the steps.

    ``checkpoint_every_s`` (with ``out_dir``): the run's state is written under ``<out_dir>/partial/`` as a stack's
    is (``runners.train.resume``: at evaluations that often, 0 at every one, None or negative never; and on Ctrl-C), and
    the run trained again goes on from it to the same record.

    ``extra``: more keys of the record (``mixlab run --config``: the run file it was read from).
    """
    if save and out_dir is None:
        raise ValueError("save=True needs an out_dir to write the checkpoint to")
    run = as_resolved(run)
    config, task, model_config = run.config, run.task, run.model_config
    tc = config.train
    device = pick_device(tc.device)  # a missing GPU fails before the folder is made
    if out_dir is not None:
        writable_folder(out_dir)
    autocast = uses_bf16(tc.precision, device)

    train_data, test_data = run_data(task, tc)
    model = initial_model(model_config, tc.init_seed, device)
    shuffle = shuffle_generator(tc.init_seed)
    n_params = models.count_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(tc.beta1, tc.beta2),
                                  weight_decay=tc.weight_decay)
    plan = StepPlan.of(tc)
    if progress:
        length = (f"{plan.total_epochs} epochs x {plan.steps_per_epoch} steps = {plan.total_steps:,} steps"
                  if tc.steps is None else f"{plan.total_steps:,} steps in epochs of {plan.steps_per_epoch}")
        if plan.total_steps < plan.schedule_steps:
            length += f", the first of a {plan.schedule_epochs}-epoch schedule"
        tqdm.write(f"{config.task} {model_config.mixer} on {device.type}: {length}, {n_params:,} parameters",
                   file=sys.stderr)

    log = RunLog(resolved=run, name=run_name)
    best_state: dict[str, torch.Tensor] | None = None  # weights at log.best, kept only when saving
    step = 0
    start_wall = time.perf_counter()
    loss_acc = torch.zeros((), device=device)
    loss_count = 0
    clock = TrainClock(device)
    saver, saved = resume.Checkpoint.open(out_dir, {log.default_name(): run.hash}, every_s=checkpoint_every_s,
                                          loop="run", device=device.type, bf16=autocast)
    if saved is not None:
        log.load_state_dict(saved.rows[0])
        shuffle.set_state(saved.rows[0]["shuffle"])
        model.load_state_dict(saved.tensors["model"])
        optimizer.load_state_dict(saved.tensors["optimizer"])
        loss_acc.copy_(saved.tensors["loss_acc"])
        best_state = saved.tensors["best_state"] or None
        step, loss_count = saved.step, saved.rows[0]["loss_count"]
        start_wall -= saved.elapsed_s
        clock.start -= saved.lap_s

    def checkpoint() -> None:
        """The run after ``step`` steps as ``resume`` saves a stack: the shuffle state before the permutation
        of the epoch its next step belongs to, the model, AdamW's state and the loss sum."""
        shuffled = shuffle.get_state() if step % plan.steps_per_epoch == 0 else epoch_shuffle
        tensors = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loss_acc": loss_acc,
                   "best_state": best_state or {}}
        row = {**log.state_dict(), "step": step, "loss_count": loss_count, "shuffle": shuffled}
        saver.write(resume.Snapshot(step=step, tensors=tensors, rows=[row],
                                    elapsed_s=time.perf_counter() - start_wall, lap_s=clock.lap()))

    bar = tqdm(total=plan.total_steps, initial=step, disable=not progress, desc=f"{config.task} {model_config.mixer}",
               unit="step", dynamic_ncols=True, leave=False)
    # sparse tasks: the head and the loss see only each row's scored positions (runners.train.metrics)
    train_positions, train_targets = scored_view(train_data.targets)  # [N, S] each, or None and [N, T]
    # the training set lives on the device: a step indexes it there, with no copy from pageable host memory
    # (each such copy waits for the GPU, like a sync)
    train_inputs, train_targets = train_data.inputs.to(device), train_targets.to(device)
    # packed rows: each row's document starts, once, on the host; a step lays its rows' out with a static
    # length and copies them to the device without a sync (kernels.utils.rows_cu_seqlens, offsets_to_device)
    train_starts = None
    if train_data.doc_ids is not None:
        train_starts = kernels.utils.row_starts(train_data.doc_ids,
                                                kernels.utils.max_docs_per_row(train_data.doc_ids))
    train_positions = None if train_positions is None else train_positions.to(device)
    model.train()
    interrupts = resume.Interrupts(active=saver is not None)
    with interrupts.held():
        try:
            while step < plan.total_steps and not log.stopped_early:
                epoch = plan.epoch_of(step)
                epoch_start = epoch * plan.steps_per_epoch
                epoch_shuffle = shuffle.get_state()
                order_host = torch.randperm(tc.num_train, generator=shuffle)
                order = order_host.to(device)
                # from the epoch's first step, or from where a resumed run left it
                for i in range(step - epoch_start, plan.steps_from(epoch_start)):
                    idx = order[plan.batch(i)]
                    inputs, targets = train_inputs[idx], train_targets[idx]  # [B, T], [B, T or S]
                    cu_seqlens = None if train_starts is None else packed_layout(
                        train_starts[order_host[plan.batch(i)]], inputs.shape[1], device)
                    positions = None if train_positions is None else train_positions[idx]  # [B, S]
                    lr = plan.lr(tc, step)
                    for group in optimizer.param_groups:
                        group["lr"] = lr
                    with bf16_autocast(device, autocast):
                        logits = model(inputs, positions=positions, cu_seqlens=cu_seqlens)  # [B, T or S, V]
                    loss = training_loss(logits, targets)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    loss_acc += loss.detach()
                    loss_count += 1
                    step += 1
                    bar.update(1)

                    if plan.evaluates_after(step):
                        log.train_time += clock.lap()
                        metrics = evaluate(model, test_data, tc.eval_batch_size, device, autocast, task)
                        if log.add_evaluation(metrics, epoch=epoch, step=step, lr=lr, loss_sum=float(loss_acc),
                                              loss_steps=loss_count) and save:
                            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
                        loss_acc.zero_()
                        loss_count = 0
                        bar.set_postfix(acc=f"{metrics['acc_macro']:.3f}", ppl=f"{metrics['test_ppl']:.3g}")
                        clock.restart()
                        if log.stopped_early:
                            break
                        if saver is not None and saver.due():
                            checkpoint()
                            clock.restart()  # writing is no training time
                    if interrupts.pending and step < plan.total_steps:  # else the record is written first
                        checkpoint()
                        raise KeyboardInterrupt
        finally:
            bar.close()

        record = log.record(n_params=n_params, device=device, steps=step, start_wall=start_wall,
                            named=out_dir is not None)
        record.update(extra or {})
        if out_dir is not None:
            if save:
                record["checkpoint"] = f"{record['name']}.pt"
                metadata = {k: record[k] for k in ("name", "config", "resolved", "versions", "seeds", "final")}
                models.save(model, Path(out_dir) / record["checkpoint"], state_dict=best_state, metadata=metadata)
            write_record(out_dir, record)
        if saver is not None:
            saver.remove()
    return record


def finished_record(run: ResolvedRun, out_dir: str | Path, save: bool = False) -> dict[str, Any] | None:
    """The record ``train_run(run, out_dir=out_dir, save=save)`` wrote before (with its model when ``save``), or
    None: a command that trained the run is not repeated when it runs again."""
    path = Path(out_dir) / f"{RunLog(resolved=run).default_name()}.json"
    if not is_record(path):
        return None
    record = json.loads(path.read_text())
    checkpoint = record.get("checkpoint")
    if save and (checkpoint is None or not (Path(out_dir) / checkpoint).is_file()):
        return None
    return record


def load_saved_run(path: str | Path, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, tasks.TaskData]:
    """The model that ``train_run(..., save=True)`` wrote to ``path`` (on ``device``) and its run's test set,
    regenerated from the run config in the checkpoint's metadata."""
    config = RunConfig.from_dict(checkpoint.metadata(path)["config"])
    _, test = run_data(resolve(config).task, config.train)
    return models.load(path, device=device), test


def packed_layout(starts: torch.Tensor, T: int, device: torch.device) -> torch.Tensor:
    """Row starts [..., B, S] (host) of a batch's rows -> their cu_seqlens [..., B * S + 1] on ``device``, with the
    host copy that the ops read instead of the device."""
    return kernels.utils.offsets_to_device(kernels.utils.rows_cu_seqlens(starts, T), device)
