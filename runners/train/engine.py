"""Many runs trained together on one device: runs of equal shapes stacked along a leading run axis, each on its own
step plan, the stack refilled from a queue as its runs end.

The lab's models are tiny (about 0.4M parameters), so one run leaves a GPU idle: its steps are bound by
kernel launches, not arithmetic. ``train_runs_batched`` stacks runs whose shapes agree and steps them as
one batched model: every parameter becomes ``[N, *shape]``, the forward is ``torch.func.vmap`` of
``torch.func.functional_call`` of one template model over (parameters, inputs ``[N, B, T]``), and AdamW
runs on one flat ``[N, P]`` buffer of all parameters with a per-run learning rate, weight decay and bias
correction. Each run keeps what ``runners.train.run.train_run`` would give it:

- its own data, shuffling and initialisation from its seeds (``runners.train.seeds``; runs with equal task,
  parameters, data seed and set sizes share one copy of the data), and its own step plan
  (``runners.train.schedule``): its epochs or steps, its training-set size (so its steps per epoch), its
  evaluation points;
- its own step counter, which sets its epoch's permutation, its learning rate (``runners.train.schedule.lr_at``
  with its own TrainConfig) and its AdamW bias correction; its own loss (``runners.train.metrics.training_loss``
  of its logits) and AdamW moments;
- its own evaluations (per-run sums of ``runners.train.metrics`` counts over ``runners.train.evaluation``'s batches),
  history, best-perplexity ``final`` and early stop (``runners.train.record``).

Why per-run plans and a queue: on the MAD protocol most runs stop early, and settings of one step shape (e.g.
in-context recall at 800 and at 12,800 training rows) differ only in their plans. Runs that shared one plan would
leave a stack mostly empty once its first runs stop, and such settings could not share one. So a stack holds
``max_stack`` rows, and a run that ends (early stop or its last step) hands its row at once to the next run of the
queue (its initial parameters, zero moments, its own step 0 and data, written into the row in place), so the stack
stays full until the queue is empty. Then a row whose run ends is left empty and dropped: at once when eager, while
compiled (below) once at most half the stack still trains.

A stack step: every row's batch has one length (static shapes), the shortest next batch of any run, so a run
whose epoch ends with a short batch takes it in a step of its own (with any other run due a batch of that
length) and the full batches go the step after. The runs of other lengths idle in that step: they compute on
some rows, and the update keeps their parameters, moments and loss sums as they were (``_adamw_update``
selects per row). An evaluation serves the runs due after this step only, one forward over the sub-stack of
their rows; eager, that costs their share of the stack; captured (CUDA graphs, below) the sub-stack is widened to
the next power of two (one graph per width), at most twice the due runs' work.

Equality (``tests/runners/test_engine.py``, ``tests/runners/test_refill.py``): on the CPU every record equals
train_run's bitwise (time fields aside), in fp32 and under bf16 autocast, whichever runs share the stack, its
row, the steps it idles and when it leaves the queue. The AdamW update repeats ``torch.optim.AdamW``'s arithmetic
op for op (decay, ``lerp_``, ``addcmul_``, ``sqrt`` / bias correction + eps, step), which on the CPU gives
the same bits for one stacked buffer as for separate parameters. On a GPU the batched kernels (and
train_run's foreach AdamW) round differently: results agree within bf16 noise, not bitwise. ``rubiconv``,
``fft_conv_leaky``, ``hyena`` and ``hyena_leaky`` batch their FFTs, the head-wise dynamic conv its generator's
matmul and ``gated_delta_net`` the matmuls of fla's naive chunked delta rule, which changes the last bits even in
fp32 on the CPU; so does the output head of tasks scored at few positions (the head runs at those positions
only, ``runners.train.metrics``: a stacked matmul of few rows rounds differently).

Which runs stack (``group_key``: the run's ``ResolvedRun.stack_key`` with the device and precision it resolves to
here): what fixes a tensor shape or the stacked arithmetic: equal resolved ModelConfig (so equal vocabulary and
sequence length), equal row shape and packing, ``batch_size``, ``num_test``, ``eval_batch_size``, ``beta1``,
``beta2`` (one AdamW update for the stack), device and precision. Free to differ: ``task`` and ``task_params``
(when the shapes agree, e.g. noisy recall's ``frac_noise``), ``epochs``, ``steps``, ``num_train``, ``eval_every``,
``lr``, ``min_lr``, ``weight_decay``, ``schedule``, ``warmup_steps``, ``early_stop_acc``, ``data_seed`` and
``init_seed``. A stack holds the data of every run of its queue on the device from the start (the training sets
end to end, the test sets stacked), so a refill copies no data.
Packed tasks stack: each run gets its own ``cu_seqlens`` [N, B * slots + 1] a step, of a static length (one slot
count for every data set of the stack), built on the host and copied with a host copy so no op syncs to read it;
attention with documents and RubiConv run once per run under vmap (``kernels.triton_utils.per_run``). Eager
only (``auto`` speed runs them eager; other modes refuse them). Runs that cannot stack
(``ResolvedRun.unbatchable_reason``) are trained one at a time by ``train_run``, in the same call:

- packed tasks with an fla-core baseline (``stacks_with_documents``): its document path reads the layout on
  the host with no per-run rule;
- ``kernel_backend="triton"`` with RubiConv (``rubiconv``, ``fft_conv_leaky``, ``hyena``, ``hyena_leaky``): its
  Triton path has no vmap rule. The short convs' custom ops have one (the runs folded into one launch, each row
  with its run's weights; one launch per run with documents), so under auto (``kernel_backend=None``) a stack
  runs the same kernels as a run alone: Triton on CUDA, the plain-torch references on the CPU; RubiConv under
  vmap runs its reference;
- mixers from outside the registry (import paths, entry points): nothing says their forward runs under vmap;
  a hybrid stack (per-layer pattern) stacks only when every mixer of it does.
Every mixer batches otherwise: attention with every ``qkv_conv``, the short-conv mixers, rubiconv,
fft_conv_leaky, hyena, hyena_leaky, none, the fla-core baselines (their Triton op's vmap rule folds the runs'
rows into one launch), and the compression autoencoder.

Time: runs of a stack step together, so the time of the shared steps is split among them. The training
time between two evaluations of the stack is measured once (after a device sync) and split among its runs by
their shares of its steps (a step's share is divided evenly among the runs that took it), so ``train_time_s`` is
a run's share, the stack's total is the sum over its runs, and ``steps_per_s`` is a run's effective rate.
Evaluation time is left out, as in train_run. ``wall_time_s`` runs from when the run took its row to its record,
so runs of one stack overlap.

Speed options (``speed``, ``runners.train.speed``: eager by default; ``auto`` compiles on CUDA, short rows graphed too):
``compile``: ``torch.compile`` the batched forward + loss and the AdamW update, with static shapes (vmap
fails on symbolic sizes), so every stack width and batch length compiles once; the per-run scalars (learning
rates, bias corrections, which rows step) are a device tensor and a refill writes its row in place, so nothing
compiles again while the queue lasts. Compiled code reorders float sums, so results match to rounding, not
bitwise. Once the queue is empty, empty rows stay in the stack, idle, until at most half of it still trains, so a
stack of N compiles for at most log2(N) widths. On CUDA the evaluation is captured as a CUDA graph, as under
``cuda_graph`` (with it eager, compiled stacks whose epochs are a few steps trained for only about half their
wall time; docs/engine.md).
``cuda_graph``: capture the whole step (gather, forward, backward, AdamW) in a CUDA graph per batch length and
replay it; the step's rows and per-run scalars are copied into its static inputs. Warm-up steps before a capture
are undone (the state is restored), so graphs change no result. The evaluation (all test batches, each slot's
sums) is captured too, once per width of the due runs' sub-stack, their rows written into its slots before a
replay (not for tasks with score groups, whose sums are the task's: packed retrieval, which is eager anyway).
Refills replay the same graphs; everything is captured again after a compaction. CUDA only.

Attention under vmap: on CUDA the stack's template model is built with ``fold_runs`` (``models.build_model``), so
attention folds the run axis into the batch and calls the fused kernels on plain tensors; on the CPU torch's own
batch rules loop over the runs (``folds_runs``).

Checkpoints (``runners.train.resume``): with ``out_dir`` and ``checkpoint_every_s``, a stack writes its whole state at
evaluations and on Ctrl-C, and a stack trained again goes on from it to the same records. ``_Loop`` holds where
the loop stands (its rows, each row's run and plan position, its queue, its records) and gives it as a
``resume.Snapshot`` of state dicts (its stack's, each row's run's, the queue's run names) between any two steps,
and takes it back.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from mixlab import kernels, models, tasks
from mixlab.core.fields import PositiveInt, check
from mixlab.core.records import read_record
from mixlab.runners.train import resume
from mixlab.runners.train.config import RunConfig
from mixlab.runners.train.evaluation import eval_batches
from mixlab.runners.train.metrics import EvalSums, scored_positions, sparse_width, training_loss
from mixlab.runners.train.precision import bf16_autocast, pick_device, uses_bf16
from mixlab.runners.train.record import RunLog, TrainClock, write_record
from mixlab.runners.train.resolved import ResolvedRun, as_resolved
from mixlab.runners.train.run import packed_layout, train_run
from mixlab.runners.train.schedule import StepPlan
from mixlab.runners.train.seeds import initial_model, run_data, shuffle_generator
from mixlab.runners.train.speed import stack_modes
from tqdm.auto import tqdm

# torch.optim.AdamW's default epsilon; TrainConfig does not set it.
ADAM_EPS = 1e-8
# Warm-up steps (undone) before a CUDA graph capture: lazy initialisations must not happen during capture.
GRAPH_WARMUP_STEPS = 2
# With compile, once the queue is empty, rows left empty stay in the stack (idle) until at most this fraction of it
# still trains: each new stack size costs a compilation.
COMPILED_COMPACTION = 0.5
# Compiled variants allowed per function (torch's default, 8, is shared by every stack of the process):
# one per stack size and batch shape (the last batch of an epoch may be smaller).
RECOMPILE_LIMIT = 256


def group_key(run: ResolvedRun) -> tuple:
    """Runs with equal keys can share a stack: the run's ``stack_key`` (resolved model config, row shape and the
    training settings that fix a tensor shape or the stacked arithmetic; module docstring lists what may differ),
    with the device and the precision it resolves to on this machine."""
    tc = run.config.train
    device = pick_device(tc.device)
    return run.stack_key, device.type, uses_bf16(tc.precision, device)


def train_runs_batched(runs: Sequence[ResolvedRun | RunConfig], *, out_dir: str | Path | None = None,
                       run_names: Sequence[str | None] | None = None, progress: bool = True,
                       speed: str = "eager", max_stack: int | None = None,
                       checkpoint_every_s: float | None = None,
                       on_step: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Train every run (resolved, or its config, which is resolved here), stacking those with equal ``group_key``;
    return their records in the order given.

    Each record equals what ``train_run(run, out_dir=out_dir, run_name=name)`` returns (time fields aside,
    module docstring) and is written to ``<out_dir>/<name>.json`` as soon as its run ends. ``speed``: how each
    stack steps (``runners.train.speed``; ``auto`` picks per stack from its device and task). ``max_stack``: the
    most runs a stack trains at once, its width; a group of more runs waits in the stack's queue, in the order
    given, and each run that ends hands its row to the next (module docstring). None = no cap.

    ``checkpoint_every_s`` (with ``out_dir``): each stack writes a checkpoint under ``<out_dir>/partial/`` at
    evaluations once that many seconds have passed since its last (0: at every evaluation; None or negative:
    never), and on Ctrl-C (``runners.train.resume``); trained again, a stack goes on from its checkpoint to the same
    records. A run that had finished before is not trained again: its record is read from ``out_dir``.

    ``on_step`` (a profiler's window, a probe): called after every step of a stack with the steps that stack has
    taken (1 after its first; a stack that goes on from a checkpoint counts on from the checkpoint's), before the
    evaluation that may follow the step; its time counts as training time. Runs trained one at a time
    (``ResolvedRun.unbatchable_reason``) never call it.
    """
    runs = [as_resolved(run) for run in runs]
    names = [None] * len(runs) if run_names is None else list(run_names)
    if len(names) != len(runs):
        raise ValueError(f"run_names has {len(names)} entries for {len(runs)} runs")
    max_stack = check("max_stack", max_stack, PositiveInt | None)
    groups: dict[tuple, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(group_key(run), []).append(i)
    records: list[dict[str, Any] | None] = [None] * len(runs)
    for members in groups.values():
        first = runs[members[0]]
        device = pick_device(first.config.train.device)
        # auto leaves packed stacks eager: their layouts are read on the host every step, which neither a compiled
        # graph nor a captured one can do
        compile, cuda_graph = ((False, False) if first.packed and speed == "auto"
                               else stack_modes(speed, device, first.row_tokens, first.auto_compiles))
        if first.packed and (compile or cuda_graph):
            raise ValueError(f"speed={speed!r} cannot serve runs of a packed task: each step's document layout is "
                             "read on the host")
        if cuda_graph and device.type != "cuda":
            raise ValueError(f"speed={speed!r} needs runs on a CUDA device (cuda_graph), got device "
                             f"{device.type!r}")
        if first.unbatchable_reason is not None:
            for i in members:
                records[i] = train_run(runs[i], out_dir=out_dir, progress=progress, run_name=names[i],
                                       checkpoint_every_s=checkpoint_every_s)
            continue
        done = _train_stack([runs[i] for i in members], [names[i] for i in members], out_dir=out_dir,
                            progress=progress, compile=compile, cuda_graph=cuda_graph,
                            compact_at=COMPILED_COMPACTION if compile else 1.0,
                            width=min(max_stack or len(members), len(members)),
                            checkpoint_every_s=checkpoint_every_s, on_step=on_step)
        for i, record in zip(members, done):
            records[i] = record
    return records


@dataclasses.dataclass(eq=False, kw_only=True)
class _Run(RunLog):
    """One run of a stack: what train_run logs for its record, and where its own step plan stands. It steps only in
    the stack's steps whose batch length is that of its next batch (``_Loop._step``)."""

    plan: StepPlan
    shuffle: torch.Generator
    offset: int = 0  # its training set's first row in the stack's training data
    step: int = 0  # optimizer steps it has taken
    loss_count: int = 0  # of them since its last evaluation
    order: torch.Tensor | None = None  # its epoch's permutation of its training rows (offset added), once drawn
    epoch_shuffle: torch.Tensor | None = None  # shuffle's state before ``order`` was drawn
    lr: float = 0.0  # of its latest step
    share: float = 0.0  # its share of the stack's steps since the training clock's last lap
    start_wall: float = 0.0  # time.perf_counter() when it took its row

    @classmethod
    def of(cls, run: ResolvedRun, name: str | None) -> _Run:
        tc = run.config.train
        return cls(resolved=run, name=name, plan=StepPlan.of(tc), shuffle=shuffle_generator(tc.init_seed))

    @property
    def next_batch(self) -> int:
        """Rows of its next step's batch."""
        return self.plan.batch_rows(self.step)

    @property
    def finished(self) -> bool:
        return self.stopped_early or self.step == self.plan.total_steps

    def batch_rows(self) -> torch.Tensor:
        """Its next step's rows of the stack's training data [next_batch]; the epoch's permutation is drawn at its
        first step (or at the first step after a resume), as train_run draws it."""
        i = self.step % self.plan.steps_per_epoch
        if i == 0 or self.order is None:
            self.epoch_shuffle = self.shuffle.get_state()
            self.order = torch.randperm(self.plan.num_train, generator=self.shuffle) + self.offset
        return self.order[self.plan.batch(i)]

    def adamw_scalars(self) -> tuple[float, float, float, float]:
        """(lr, decay 1 - lr * wd, step size -lr / (1 - beta1^t), sqrt(1 - beta2^t)) of its next step, t its AdamW
        step count after it, in float64 as torch.optim.AdamW computes them."""
        train = self.resolved.config.train
        t = float(self.step + 1)
        lr = self.plan.lr(train, self.step)
        return lr, 1 - lr * train.weight_decay, -(lr / (1 - train.beta1**t)), (1 - train.beta2**t) ** 0.5

    def state_dict(self) -> dict[str, Any]:
        """The log's state dict, its step counters, and its shuffle generator's state before the permutation of
        the epoch its next step belongs to (drawn again on load)."""
        fresh = self.order is None or self.step % self.plan.steps_per_epoch == 0  # next step draws a permutation
        return {**super().state_dict(), "step": self.step, "loss_count": self.loss_count,
                "shuffle": self.shuffle.get_state() if fresh else self.epoch_shuffle, "share": self.share,
                "wall_s": time.perf_counter() - self.start_wall}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.step, self.loss_count, self.share = state["step"], state["loss_count"], state["share"]
        self.shuffle.set_state(state["shuffle"])
        self.order = None
        self.start_wall = time.perf_counter() - state["wall_s"]


def folds_runs(device: torch.device) -> bool:
    """Whether a stack on ``device`` builds its model with ``fold_runs`` (``models.build_model``: attention folds
    the run axis into the batch and calls the fused kernels on plain tensors). On CUDA it does: SDPA's own batch
    rules failed in backward there (torch 2.11 on an H200: "LSE is not correctly aligned"), and their only
    alternative, the math backend, made a stack 3x slower. On the CPU it does not: torch's batch rules loop over
    the runs, which keeps every record bitwise equal to train_run's (the CPU flash kernel's sums depend on the
    batch size, so a folded batch changes the last bits)."""
    return device.type == "cuda"


@functools.lru_cache(maxsize=16)
def _template(model_config: models.ModelConfig, device: torch.device, fold_runs: bool) -> torch.nn.Module:
    """The module whose forward every stack of this config calls with its own parameters (functional_call).

    One per config, so compiled code, which is specialised to the module, serves every stack of that config.
    """
    with torch.random.fork_rng(devices=[]):  # its own initial values are never used
        return models.build_model(model_config, fold_runs=fold_runs).to(device)


def _quiet_vmap_loops(device: torch.device) -> contextlib.AbstractContextManager:
    """Where runs are not folded (``folds_runs``: the CPU), attention's batch rules loop over the runs on purpose
    (bitwise records): torch's warning about the missing batch rule would only alarm the reader of a sweep's
    output. Nothing where they are folded."""
    return nullcontext() if folds_runs(device) else _quiet_vmap_fallback()


@contextlib.contextmanager
def _quiet_vmap_fallback() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet")
        yield


def _batched_losses(template: torch.nn.Module, params: dict[str, torch.Tensor], inputs: torch.Tensor,
                    targets: torch.Tensor, positions: torch.Tensor | None, autocast: bool,
                    cache: bool, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Per-run training losses [N] of params {name: [N, *shape]} on inputs [N, B, T]; targets [N, B, T], or
    [N, B, S] at positions [N, B, S] when the head runs at scored positions only (runners.train.metrics); packed
    tasks' layouts cu_seqlens [N, B * slots + 1]."""

    with bf16_autocast(inputs.device, autocast, cache), _quiet_vmap_loops(inputs.device):
        logits = _stacked_logits(template, params, inputs, positions, cu_seqlens)  # [N, B, T or S, V]
    # unbind, not logits[n]: its backward stacks the N gradients once instead of N full-size scatters.
    return torch.stack([training_loss(lg, tg) for lg, tg in zip(logits.float().unbind(0), targets.unbind(0))])


def _stacked_logits(template: torch.nn.Module, params: dict[str, torch.Tensor], inputs: torch.Tensor,
                    positions: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """Each run's logits [N, B, T, V] on its inputs [N, B, T], or [N, B, S, V] at positions [N, B, S]; with
    documents laid out by cu_seqlens [N, B * slots + 1]."""

    def forward(p: dict[str, torch.Tensor], x: torch.Tensor, pos: torch.Tensor | None,
                cu: torch.Tensor | None) -> torch.Tensor:
        return torch.func.functional_call(template, p, (x,), {"positions": pos, "cu_seqlens": cu})

    in_dims = (0, 0, None if positions is None else 0, None if cu_seqlens is None else 0)
    return torch.func.vmap(forward, in_dims=in_dims)(params, inputs, positions, cu_seqlens)


def _scored(targets: list[torch.Tensor]) -> tuple[list[torch.Tensor] | None, list[torch.Tensor]]:
    """Targets [rows, T] of each distinct data set as the stack's head sees them: (None, targets) for dense tasks,
    or (positions, targets) [rows, S] at the scored positions (runners.train.metrics), S the widest set's."""
    widths = [sparse_width(t) for t in targets]
    if any(w is None for w in widths):
        return None, targets
    pairs = [scored_positions(t, max(widths)) for t in targets]
    return [p for p, _ in pairs], [t for _, t in pairs]


@torch.no_grad()
def _adamw_update(params: torch.Tensor, grads: Sequence[torch.Tensor], exp_avg: torch.Tensor,
                  exp_avg_sq: torch.Tensor, scalars: torch.Tensor, beta1: float, beta2: float) -> None:
    """torch.optim.AdamW's step on flat [N, P] tensors, in its op order, for the rows that step; the others keep
    their parameters and moments. grads are each parameter's [N, *shape] in the flat layout's order; scalars
    [4, N] hold per row decay = 1 - lr * wd, step_size = -lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t) (t the
    row's own AdamW step count) and 1 for a row that steps, 0 for one that idles."""
    # one concatenation, which compiled code fuses into the update, instead of a copy per parameter
    grads = torch.cat([g.reshape(g.shape[0], -1) for g in grads], dim=1)  # [N, P]
    decay, step_size, bc2_sqrt, steps = scalars[:, :, None].unbind(0)  # each [N, 1]
    stepping = steps > 0
    new_params = params * decay
    new_avg = exp_avg.lerp(grads, 1 - beta1)
    new_sq = (exp_avg_sq * beta2).addcmul_(grads, grads, value=1 - beta2)
    denom = (new_sq.sqrt() / bc2_sqrt).add_(ADAM_EPS)
    new_params.add_(step_size * new_avg / denom)  # addcdiv's order: param + (value * m) / denom
    for state, new in ((params, new_params), (exp_avg, new_avg), (exp_avg_sq, new_sq)):
        state.copy_(torch.where(stepping, new, state))


def _data_key(run: ResolvedRun) -> str:
    """Runs with equal keys train and test on the same rows (``seeds.run_data``)."""
    tc = run.config.train
    return json.dumps([run.config.task, dataclasses.asdict(run.task.params), tc.data_seed, tc.num_train, tc.num_test],
                      sort_keys=True, default=str)


def _eval_width(due: int, width: int) -> int:
    """Rows of a captured evaluation of ``due`` runs in a stack of ``width``: the next power of two (a graph per
    power, not per count), at most the stack."""
    return min(width, 1 << (due - 1).bit_length())


class _Stack:
    """A stack's state: ``width`` rows, each holding one run or none, of flat parameters and AdamW moments [N, P];
    the training and test data of every run it may hold, on the device; and the batched step (eager, compiled or
    CUDA-graphed) and evaluation."""

    def __init__(self, runs: list[ResolvedRun], width: int, device: torch.device, autocast: bool, compile: bool,
                 cuda_graph: bool) -> None:
        tc = runs[0].config.train
        self.device, self.autocast, self.cuda_graph = device, autocast, cuda_graph
        self.beta1, self.beta2 = tc.beta1, tc.beta2
        self.template = _template(runs[0].model_config, device, folds_runs(device))
        self.names = [name for name, _ in self.template.named_parameters()]
        self.shapes = [p.shape for _, p in self.template.named_parameters()]
        self.n_params = models.count_parameters(self.template)
        self.params = torch.zeros(width, self.n_params, device=device)  # [N, P]; rows are filled by ``load_row``
        self.exp_avg = torch.zeros_like(self.params)
        self.exp_avg_sq = torch.zeros_like(self.params)
        self.loss_acc = torch.zeros(width, device=device)  # [N] training-loss sums since each row's last eval

        # every distinct data set once: the training sets end to end [R, T] (a run's rows from its ``offset``), the
        # test sets (num_test is equal within a stack) stacked [U, num_test, T]
        self.offsets: dict[str, int] = {}
        self.test_sets: dict[str, int] = {}
        train_sets, test_sets = [], []
        for run in runs:
            key = _data_key(run)
            if key not in self.offsets:
                self.offsets[key] = sum(len(d) for d in train_sets)
                self.test_sets[key] = len(test_sets)
                train_data, test_data = run_data(run.task, run.config.train)
                train_sets.append(train_data)
                test_sets.append(test_data)
        self.train_inputs = torch.cat([d.inputs for d in train_sets]).to(device)  # [R, T]
        # sparse tasks: as train_run, the head and the loss see only the scored positions [R, S]
        positions, targets = _scored([d.targets for d in train_sets])
        self.train_positions = None if positions is None else torch.cat(positions).to(device)
        self.train_targets = torch.cat(targets).to(device)
        self.test_inputs = torch.stack([d.inputs for d in test_sets]).to(device)  # [U, num_test, T]
        positions, targets = _scored([d.targets for d in test_sets])
        self.test_positions = None if positions is None else torch.stack(positions).to(device)
        self.test_targets = torch.stack(targets).to(device)
        self.data_index_host = torch.zeros(width, dtype=torch.long)  # [N]: each row's test set
        self.data_index = self.data_index_host.to(device)
        # packed tasks: every row's document starts on the host (training [R, slots], test [U, num_test, slots]),
        # one slot count for the stack (the most documents of any row), so each step's layouts stack
        self.train_starts = self.test_starts = None
        if train_sets[0].doc_ids is not None:
            slots = kernels.utils.max_docs_per_row(*(d.doc_ids for d in train_sets + test_sets))
            self.train_starts = torch.cat([kernels.utils.row_starts(d.doc_ids, slots) for d in train_sets])
            self.test_starts = torch.stack([kernels.utils.row_starts(d.doc_ids, slots) for d in test_sets])

        # static shapes: vmap does not run on symbolic sizes (dynamic=None fails once a second shape shows up)
        self.compile = compile
        self.losses_fn = torch.compile(_batched_losses, dynamic=False) if compile else _batched_losses
        self.update_fn = torch.compile(_adamw_update, dynamic=False) if compile else _adamw_update
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        self.graph_pool = None
        # the evaluation as CUDA graphs, one per width (_eval_width), with the steps' graphs and in compiled stacks
        # on CUDA; not for tasks that report score groups (their sums are the task's, and the rows' tasks change)
        self.graph_eval = (cuda_graph or (compile and device.type == "cuda")) and not any(
            run.task.score_groups(test_sets[self.test_sets[_data_key(run)]].targets) for run in runs)
        # width -> the graph, the rows its slots read [width] (rewritten before a replay), the sums it rewrites
        self.eval_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, list[EvalSums]]] = {}

    def __len__(self) -> int:
        return self.params.shape[0]

    def offset(self, run: ResolvedRun) -> int:
        """The first row of ``run``'s training set in the stack's training data."""
        return self.offsets[_data_key(run)]

    def load_row(self, n: int, run: ResolvedRun, *, fresh: bool) -> None:
        """Give row ``n`` to ``run``: its test set, and when ``fresh`` its start (train_run's initial parameters,
        zero moments and loss sum), written in place so compiled code and captured graphs serve it unchanged."""
        self.data_index_host[n] = self.data_index[n] = self.test_sets[_data_key(run)]
        if not fresh:
            return
        model = initial_model(run.model_config, run.config.train.init_seed, torch.device("cpu"))
        named = dict(model.named_parameters())
        self.params[n] = torch.cat([named[name].detach().reshape(-1) for name in self.names])
        for state in (self.exp_avg, self.exp_avg_sq, self.loss_acc):
            state[n] = 0.0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The stack's training state on the CPU: flat parameters and AdamW moments [N, P], training-loss sums
        since each row's last evaluation [N]."""
        return {"params": self.params.detach().cpu(), "exp_avg": self.exp_avg.detach().cpu(),
                "exp_avg_sq": self.exp_avg_sq.detach().cpu(), "loss_acc": self.loss_acc.detach().cpu()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Put back a ``state_dict`` of a stack of this width, in place."""
        for name, tensor in (("params", self.params), ("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq),
                             ("loss_acc", self.loss_acc)):
            tensor.copy_(state[name])

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view [N, *shape] of a flat [N, P] tensor."""
        views, start = [], 0
        for shape in self.shapes:
            size = math.prod(shape)
            views.append(flat[:, start : start + size].view(flat.shape[0], *shape))
            start += size
        return views

    def _leaves(self) -> list[torch.Tensor]:
        """The parameters' views of the flat parameters, as leaves that require grad."""
        return [view.requires_grad_() for view in self._views(self.params)]

    def layout(self, starts: torch.Tensor | None) -> torch.Tensor | None:
        """Each run's cu_seqlens [N, B * slots + 1] on the device from its batch's rows' document starts [N, B, slots]
        (host); None for unpacked tasks."""
        return None if starts is None else packed_layout(starts, self.train_inputs.shape[-1], self.device)

    def _step(self, idx: torch.Tensor, scalars: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> None:
        """One optimizer step of the rows that step (``_adamw_update``'s scalars [4, N]); idx [N, B] are rows of the
        stack's training data, cu_seqlens [N, B * slots + 1] their layouts (packed tasks)."""
        inputs, targets = self.train_inputs[idx], self.train_targets[idx]  # [N, B, T], [N, B, T or S]
        positions = None if self.train_positions is None else self.train_positions[idx]  # [N, B, S]
        leaves = self._leaves()
        limit = torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT) if self.compile else nullcontext()
        with limit:
            losses = self.losses_fn(self.template, dict(zip(self.names, leaves)), inputs, targets, positions,
                                    self.autocast, not self.cuda_graph, cu_seqlens)  # [N]
            grads = torch.autograd.grad(losses.sum(), leaves)  # d(sum)/d(run n's params) = d(loss n)/d(...)
            self.update_fn(self.params, grads, self.exp_avg, self.exp_avg_sq, scalars, self.beta1, self.beta2)
        self.loss_acc += torch.where(scalars[3] > 0, losses.detach(), 0.0)

    def step(self, idx: torch.Tensor, scalars: torch.Tensor) -> None:
        """One step of the stack from host tensors: idx [N, B] (rows of the training data), scalars [4, N] (fp32,
        ``_adamw_update``); copied to the device without a sync."""
        cu_seqlens = None if self.train_starts is None else self.layout(self.train_starts[idx])
        idx = kernels.utils.host_to_device(idx, torch.long, self.device)
        scalars = kernels.utils.host_to_device(scalars, torch.float32, self.device)
        if not self.cuda_graph:  # packed tasks (cu_seqlens) never take graphs: train_runs_batched refuses them
            self._step(idx, scalars, cu_seqlens)
            return
        if idx.shape[1] not in self.graphs:
            self._capture(idx, scalars)
        graph, static = self.graphs[idx.shape[1]]
        static["idx"].copy_(idx)
        static["scalars"].copy_(scalars)
        graph.replay()

    def _capture(self, idx: torch.Tensor, scalars: torch.Tensor) -> None:
        """Capture the step for batches of idx.shape[1] rows; warm-up steps first, their effect undone."""
        static = {"idx": idx.clone(), "scalars": scalars.clone()}
        state = (self.params, self.exp_avg, self.exp_avg_sq, self.loss_acc)
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_STEPS):
                self._step(**static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        for t, copy in zip(state, saved):
            t.copy_(copy)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            self._step(**static)
        self.graph_pool = graph.pool()
        self.graphs[idx.shape[1]] = (graph, static)

    def take_train_losses(self, rows: list[int]) -> list[float]:
        """The training-loss sums of these rows since their last call (as floats), then reset them."""
        index = torch.tensor(rows, device=self.device)
        out = self.loss_acc.index_select(0, index).tolist()
        self.loss_acc.index_fill_(0, index, 0.0)
        return out

    @torch.no_grad()
    def evaluate(self, run_tasks: list[tasks.Task], rows: list[int], batch_size: int) -> list[dict[str, float]]:
        """Test metrics of the runs in these rows (of these tasks), as ``runners.train.evaluation.evaluate`` computes
        them; one forward over the sub-stack of those rows serves them all. With graph_eval the whole evaluation
        (every test batch and every slot's sums) is captured once per width (``_eval_width``: the rows, then the
        last one again) and replayed with the rows written into its slots: eager, its few thousand small
        launches cost more than the training steps between two evaluations (MAD evaluates every epoch)."""
        if not self.graph_eval:
            slots = torch.tensor(rows, device=self.device)
            return [acc.metrics() for acc in self._eval_sums(run_tasks, slots, self.data_index_host[rows], batch_size)]
        width = _eval_width(len(rows), len(self))
        if width not in self.eval_graphs:
            self.eval_graphs[width] = self._capture_eval(width, batch_size)
        graph, slots, sums = self.eval_graphs[width]
        slots.copy_(kernels.utils.host_to_device(rows + rows[-1:] * (width - len(rows)), torch.long, self.device))
        graph.replay()
        return [acc.metrics() for acc in sums[: len(rows)]]  # each reads the tensors the replay rewrote

    def _eval_sums(self, run_tasks: list[tasks.Task | None], slots: torch.Tensor, sets_host: torch.Tensor | None,
                   batch_size: int) -> list[EvalSums]:
        """The sums over the test set of the runs in rows ``slots`` [w] (device), one per slot, still on the device;
        ``sets_host`` [w], the slots' test sets on the host, lays out packed tasks' documents."""
        sums = [EvalSums(task) for task in run_tasks]
        params = dict(zip(self.names, self._views(self.params.index_select(0, slots))))
        sets = self.data_index.index_select(0, slots)  # [w]
        for batch in eval_batches(self.test_inputs.shape[1], batch_size):
            inputs = self.test_inputs[sets, batch]  # [w, B, T]
            targets = self.test_targets[sets, batch]  # [w, B, T or S]
            positions = None if self.test_positions is None else self.test_positions[sets, batch]
            cu_seqlens = None if self.test_starts is None else self.layout(self.test_starts[sets_host][:, batch])
            with bf16_autocast(self.device, self.autocast, not self.graph_eval), _quiet_vmap_loops(self.device):
                logits = _stacked_logits(self.template, params, inputs, positions, cu_seqlens)  # [w, B, T or S, V]
            for n, acc in enumerate(sums):
                acc.add(logits[n], targets[n])
        return sums

    def _capture_eval(self, width: int, batch_size: int
                      ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, list[EvalSums]]:
        """The evaluation of ``width`` slots as a CUDA graph (one eager pass first, on a side stream, to warm the
        libraries up): the slots' rows [width], and the sums that hold the graph's output tensors (tasks without
        score groups: a slot's sums do not depend on its run's task). It shares the training graphs' memory pool
        (one pool, not two, per stack: at sequence length 1024 each holds gigabytes), which is safe here: graphs
        replay one at a time on one stream, no training graph output outlives its replay (the state it
        updates lives outside the pool), and an evaluation's outputs are read before the next replay."""
        slots = torch.zeros(width, dtype=torch.long, device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._eval_sums([None] * width, slots, None, batch_size)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            sums = self._eval_sums([None] * width, slots, None, batch_size)
        self.graph_pool = graph.pool()
        return graph, slots, sums

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (indices into the current stack), in this order."""
        index = torch.tensor(rows, device=self.device)
        self.params = self.params.index_select(0, index)
        self.exp_avg = self.exp_avg.index_select(0, index)
        self.exp_avg_sq = self.exp_avg_sq.index_select(0, index)
        self.loss_acc = self.loss_acc.index_select(0, index)
        self.data_index = self.data_index.index_select(0, index)
        self.data_index_host = self.data_index_host[rows]
        self.graphs.clear()  # captured graphs point at the old buffers
        self.eval_graphs.clear()
        self.graph_pool = None


def _train_stack(resolved: list[ResolvedRun], names: list[str | None], *, out_dir: str | Path | None,
                 progress: bool, compile: bool, cuda_graph: bool, compact_at: float, width: int | None = None,
                 checkpoint_every_s: float | None = None,
                 on_step: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Train runs of one group_key in one stack of ``width`` rows (None: every run at once), the others queued in
    the order given; records in that order. Once the queue is empty, rows left empty leave the stack when at
    most ``compact_at`` of its rows still train (1.0: at once). With ``out_dir`` and ``checkpoint_every_s``, the
    stack goes on from its checkpoint and writes new ones (``runners.train.resume``). ``on_step``: as
    ``train_runs_batched``'s."""
    tc = resolved[0].config.train
    device = pick_device(tc.device)
    autocast = uses_bf16(tc.precision, device)
    runs = [_Run.of(run, name) for run, name in zip(resolved, names)]
    asked = {run.default_name(): run for run in runs}
    saver, saved = resume.Checkpoint.open(out_dir, {name: run.resolved.hash for name, run in asked.items()},
                                          every_s=checkpoint_every_s, loop="stack", device=device.type, bf16=autocast)
    width = min(width or len(runs), len(runs))
    rows, queue = runs[:width], runs[width:]
    if saved is not None:
        # the checkpoint's rows in its order (a row whose run is not asked for had finished since: it is empty), and
        # its queue; runs asked for in neither had finished before (records in out_dir)
        rows = [None if row is None else asked.get(row["name"]) for row in saved.rows]
        queue = [asked[name] for name in saved.queue if name in asked]
    todo = sum(run is not None for run in rows) + len(queue)
    stack = _Stack(resolved, len(rows), device, autocast, compile, cuda_graph)
    loop = _Loop(stack, rows, collections.deque(queue), out_dir, compact_at, on_step)
    loop.start(saved)
    bar = tqdm(total=todo, disable=not progress, unit="run", dynamic_ncols=True, leave=False,
               desc=f"{resolved[0].config.task} {resolved[0].model_config.mixer} x{len(loop.rows)}")
    interrupts = resume.Interrupts(active=saver is not None)
    try:
        with interrupts.held():
            loop.train(bar, saver, interrupts)
            if saver is not None:
                saver.remove()
    finally:
        bar.close()
    # a run that finished before its stack was resumed has its record in out_dir (or its archive) already
    return [loop.records[id(run)] if id(run) in loop.records else read_record(out_dir, run.default_name())
            for run in runs]


@dataclasses.dataclass(eq=False)
class _Loop:
    """A stack's training loop and where it stands: ``step`` stack steps taken; ``rows`` the stack's runs, row by
    row (None: an empty row, idle until a compaction drops it); ``queue`` the runs waiting for a row; ``records``
    those written so far, by ``id`` of their run; ``on_step`` called with ``step`` after each step."""

    stack: _Stack
    rows: list[_Run | None]
    queue: collections.deque[_Run]
    out_dir: str | Path | None
    compact_at: float
    on_step: Callable[[int], None] | None = None
    step: int = 0
    records: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start_wall = time.perf_counter()
        self.clock = TrainClock(self.stack.device)

    @property
    def live(self) -> list[int]:
        return [n for n, run in enumerate(self.rows) if run is not None]

    def start(self, saved: resume.Snapshot | None) -> None:
        """Load every row's run at its start, or where ``saved`` (taken of a stack of this width) has it; rows left
        empty (their runs finished since the snapshot) take queued runs."""
        if saved is not None:
            self.stack.load_state_dict(saved.tensors)
            self.step = saved.step
            self.start_wall -= saved.elapsed_s
            self.clock.start -= saved.lap_s
        for n, run in enumerate(self.rows):
            if run is None:
                self._refill(n)
            elif saved is None:
                self._place(n, run)
            else:
                run.load_state_dict(saved.rows[n])
                run.offset = self.stack.offset(run.resolved)
                self.stack.load_row(n, run.resolved, fresh=False)
        self._compact()

    def train(self, bar: tqdm, saver: resume.Checkpoint | None, interrupts: resume.Interrupts) -> None:
        """Step until every run has finished; checkpoint at evaluations when ``saver`` is due, and after the
        step in flight when ``interrupts`` has one pending (then raise KeyboardInterrupt)."""
        while self.live:
            stepped = self._step()
            if self.on_step is not None:
                self.on_step(self.step)
            due = [n for n in stepped if self.rows[n].plan.evaluates_after(self.rows[n].step)]
            if due:
                bar.update(self._evaluate(due))
                if not self.live:
                    return
                self._compact()
                bar.set_postfix(rows=len(self.live), queued=len(self.queue))
                self.clock.restart()
                if saver is not None and saver.due():
                    saver.write(self.snapshot())
                    self.clock.restart()  # writing is no training time
            if interrupts.pending:
                saver.write(self.snapshot())
                raise KeyboardInterrupt

    def _place(self, n: int, run: _Run) -> None:
        """Give row ``n`` to ``run`` at its step 0."""
        run.offset = self.stack.offset(run.resolved)
        run.start_wall = time.perf_counter()
        self.stack.load_row(n, run.resolved, fresh=True)
        self.rows[n] = run

    def _refill(self, n: int) -> None:
        """Give row ``n`` to the next queued run, or leave it empty."""
        self.rows[n] = None
        if self.queue:
            self._place(n, self.queue.popleft())

    def _step(self) -> list[int]:
        """One step of the stack; returns the rows that stepped. Every row's batch has one length: the shortest
        next batch of any live run (an epoch's short last batch), so those runs step and the others idle, their
        parameters and moments untouched (``_adamw_update``); the full batches go the step after."""
        live = self.live
        length = min(self.rows[n].next_batch for n in live)
        stepped = [n for n in live if self.rows[n].next_batch == length]
        idx = torch.zeros(len(self.rows), length, dtype=torch.long)  # idle rows read row 0, unused
        scalars = [[1.0, 0.0, 1.0, 0.0] for _ in self.rows]  # per row: decay, step size, bc2_sqrt, steps
        for n in stepped:
            run = self.rows[n]
            idx[n] = run.batch_rows()
            run.lr, *adamw = run.adamw_scalars()
            scalars[n] = [*adamw, 1.0]
        self.stack.step(idx, torch.tensor(scalars, dtype=torch.float32).T.contiguous())
        for n in stepped:
            run = self.rows[n]
            run.step += 1
            run.loss_count += 1
            run.share += 1 / len(stepped)
        self.step += 1
        return stepped

    def _evaluate(self, due: list[int]) -> int:
        """Evaluate the runs of rows ``due``; write the records of those that end here and give their rows to the
        queue. Returns how many ended."""
        # the training time since the last lap, split among the runs by their shares of its steps
        lap, live = self.clock.lap(), [self.rows[n] for n in self.live]
        shares = sum(run.share for run in live)
        for run in live:
            run.train_time += lap * run.share / shares
            run.share = 0.0
        runs = [self.rows[n] for n in due]
        train_losses = self.stack.take_train_losses(due)
        metrics = self.stack.evaluate([run.resolved.task for run in runs], due,
                                      runs[0].resolved.config.train.eval_batch_size)
        ended = 0
        for n, run, row_metrics, loss_sum in zip(due, runs, metrics, train_losses):
            run.add_evaluation(row_metrics, epoch=run.plan.epoch_of(run.step - 1), step=run.step, lr=run.lr,
                               loss_sum=loss_sum, loss_steps=run.loss_count)
            run.loss_count = 0
            if run.finished:
                record = run.record(n_params=self.stack.n_params, device=self.stack.device, steps=run.step,
                                    start_wall=run.start_wall, named=self.out_dir is not None)
                if self.out_dir is not None:
                    write_record(self.out_dir, record)
                self.records[id(run)] = record
                self._refill(n)
                ended += 1
        return ended

    def _compact(self) -> None:
        """Drop the empty rows once at most ``compact_at`` of the stack still trains (the queue is empty then: a row
        is left empty only when it is)."""
        keep = self.live
        if len(keep) == len(self.rows) or len(keep) > len(self.rows) * self.compact_at or not keep:
            return
        self.stack.keep(keep)
        self.rows = [self.rows[n] for n in keep]

    def snapshot(self) -> resume.Snapshot:
        """Where the loop stands, as state dicts: the stack's, each row's run's (None for an empty row), and the
        queue's run names."""
        lap_s = self.clock.lap()
        return resume.Snapshot(step=self.step, tensors=self.stack.state_dict(),
                               rows=[None if run is None else run.state_dict() for run in self.rows],
                               queue=[run.default_name() for run in self.queue],
                               elapsed_s=time.perf_counter() - self.start_wall, lap_s=lap_s)
