"""Many runs trained together on one device: runs of equal shapes stacked along a leading run axis.

The lab's models are tiny (about 0.4M parameters), so one run leaves a GPU idle: its steps are bound by
kernel launches, not arithmetic. ``train_runs_batched`` stacks N runs whose shapes agree and steps them as
one batched model: every parameter becomes ``[N, *shape]``, the forward is ``torch.func.vmap`` of
``torch.func.functional_call`` of one template model over (parameters, inputs ``[N, B, T]``), and AdamW
runs on one flat ``[N, P]`` buffer of all parameters with a per-run learning rate and weight decay. Each
run keeps what ``runners.train.run.train_run`` would give it:

- its own data, shuffling and initialisation from its seeds (``runners.train.seeds``; runs with equal task,
  parameters and data seed share one copy of the data), and the same step plan (``runners.train.schedule``);
- its own loss (``runners.train.metrics.training_loss`` of its logits), learning-rate schedule
  (``runners.train.schedule.lr_at`` with its own TrainConfig) and AdamW moments;
- its own evaluations (per-run sums of ``runners.train.metrics`` counts over ``runners.train.evaluation``'s batches),
  history, best-perplexity ``final`` and early stop (``runners.train.record``). A run that stops early is written
  at once and dropped from the stack (its rows of the parameters, moments and data indices are removed), so
  the others go on unslowed (with ``compile``, see below, a finished run may stay a while, frozen).

Equality (``tests/runners/test_engine.py``): on the CPU every record equals train_run's bitwise (time
fields aside), in fp32 and under bf16 autocast. The AdamW update repeats ``torch.optim.AdamW``'s arithmetic
op for op (decay, ``lerp_``, ``addcmul_``, ``sqrt`` / bias correction + eps, step), which on the CPU gives
the same bits for one stacked buffer as for separate parameters. On a GPU the batched kernels (and
train_run's foreach AdamW) round differently: results agree within bf16 noise, not bitwise. ``rubiconv``,
``fft_conv_leaky``, ``hyena`` and ``hyena_leaky`` batch their FFTs, the head-wise dynamic conv its generator's
matmul and ``gated_delta_net`` the matmuls of fla's naive chunked delta rule, which changes the last bits even in
fp32 on the CPU; so does the output head of tasks scored at few positions (the head runs at those positions
only, ``runners.train.metrics``: a stacked matmul of few rows rounds differently).

Which runs stack (``group_key``: the run's ``ResolvedRun.stack_key`` with the device and precision it resolves to
here): equal resolved ModelConfig (so equal vocabulary and sequence length), equal data shape, equal
``epochs``/``steps``, ``batch_size``, ``num_train``, ``num_test``, ``eval_batch_size``, ``eval_every``, ``beta1``,
``beta2``, device and precision. Free to differ: ``task``
and ``task_params`` (when the shapes agree, e.g. noisy recall's ``frac_noise``), ``lr``, ``min_lr``,
``weight_decay``, ``schedule``, ``warmup_steps``, ``early_stop_acc``, ``data_seed`` and ``init_seed``.
Packed tasks stack: each run gets its own ``cu_seqlens`` [N, B * slots + 1] a step, of a static length (one slot
count per stack, ``_Stack.layout``), built on the host and copied with a host copy so no op syncs to read it;
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
time between two evaluations is measured once (after a device sync) and divided evenly among the runs
trained in it, so ``train_time_s`` is a run's share, the stack's total is the sum over its runs, and
``steps_per_s`` is a run's effective rate. Evaluation time is left out, as in train_run. ``wall_time_s``
runs from the start of the stack's training loop to the run's record, so runs of one stack overlap.

Speed options (``speed``, ``runners.train.speed``: eager by default; ``auto`` compiles on CUDA, short rows graphed too):
``compile``: ``torch.compile`` the batched forward + loss and the AdamW update, with static shapes (vmap
fails on symbolic sizes), so every stack size and batch shape compiles once; compiled code reorders float
sums, so results match to rounding, not bitwise. Finished runs then stay in the stack, trained on but
unreported, until at most half of it still trains, so a stack of N compiles for at most log2(N) sizes. On
CUDA the evaluation is captured as a CUDA graph, as under ``cuda_graph`` (with it eager, compiled stacks whose
epochs are a few steps trained for only about half their wall time; docs/engine.md).
``cuda_graph``: capture the whole step (gather, forward, backward, AdamW) in a CUDA graph per batch shape
and replay it; the per-step scalars live on the device. Warm-up steps before a capture are undone (the
state is restored), so graphs change no result. The evaluation (all test batches, every run's sums) is
captured too, once per set of live runs. Recaptured after runs drop out. CUDA only.

Attention under vmap: on CUDA the stack's template model is built with ``fold_runs`` (``models.build_model``), so
attention folds the run axis into the batch and calls the fused kernels on plain tensors; on the CPU torch's own
batch rules loop over the runs (``folds_runs``).

Checkpoints (``runners.train.resume``): with ``out_dir`` and ``checkpoint_every_s``, a stack writes its whole state at
evaluations and on Ctrl-C, and a stack trained again goes on from it to the same records. ``_Loop`` holds where
the loop stands (step, rows, records) and gives it as a ``resume.Snapshot`` of state dicts (its stack's, each
row's) between any two steps, and takes it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from mixlab import kernels, models, tasks
from mixlab.core.fields import PositiveInt, check
from mixlab.core.records import read_record
from mixlab.runners.train import resume
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.evaluation import eval_batches
from mixlab.runners.train.metrics import EvalSums, scored_positions, sparse_width, training_loss
from mixlab.runners.train.precision import bf16_autocast, pick_device, uses_bf16
from mixlab.runners.train.record import RunLog, TrainClock, write_record
from mixlab.runners.train.resolved import ResolvedRun, as_resolved, resolve
from mixlab.runners.train.run import packed_layout, train_run
from mixlab.runners.train.schedule import StepPlan
from mixlab.runners.train.seeds import initial_model, run_data, shuffle_generator
from mixlab.runners.train.speed import stack_modes
from tqdm.auto import tqdm

# torch.optim.AdamW's default epsilon; TrainConfig does not set it.
ADAM_EPS = 1e-8
# Warm-up steps (undone) before a CUDA graph capture: lazy initialisations must not happen during capture.
GRAPH_WARMUP_STEPS = 2
# With compile, finished runs stay in the stack (trained on, unreported) until at most this fraction of it
# is still training: each new stack size costs a compilation.
COMPILED_COMPACTION = 0.5
# Compiled variants allowed per function (torch's default, 8, is shared by every stack of the process):
# one per stack size and batch shape (the last batch of an epoch may be smaller).
RECOMPILE_LIMIT = 256


def group_key(run: ResolvedRun) -> tuple:
    """Runs with equal keys can be stacked: the run's ``stack_key`` (resolved model config, data shape and every
    training setting that fixes shapes or the step/evaluation schedule; module docstring lists what may differ),
    with the device and the precision it resolves to on this machine."""
    tc = run.config.train
    device = pick_device(tc.device)
    return run.stack_key, device.type, uses_bf16(tc.precision, device)


def chunks(members: Sequence[int], max_stack: int) -> list[list[int]]:
    """``members`` in order, cut into the fewest stacks of at most ``max_stack``, their sizes differing by at
    most one: 90 runs at 64 make stacks of 45 and 45, not 64 and 26 (one stack size to compile, not two, and
    the two stacks take as long)."""
    count = -(-len(members) // max_stack)
    size, extra = divmod(len(members), count)
    bounds = [0]
    for n in range(count):
        bounds.append(bounds[-1] + size + (n < extra))
    return [list(members[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]


def train_runs_batched(runs: Sequence[ResolvedRun | RunConfig], *, out_dir: str | Path | None = None,
                       run_names: Sequence[str | None] | None = None, progress: bool = True,
                       speed: str = "eager", max_stack: int | None = None,
                       checkpoint_every_s: float | None = None) -> list[dict[str, Any]]:
    """Train every run (resolved, or its config, which is resolved here), stacking those with equal ``group_key``;
    return their records in the order given.

    Each record equals what ``train_run(run, out_dir=out_dir, run_name=name)`` returns (time fields aside,
    module docstring) and is written to ``<out_dir>/<name>.json`` as soon as its run ends. ``speed``: how each
    stack steps (``runners.train.speed``; ``auto`` picks per stack from its device and task). ``max_stack`` caps
    the runs per stack (a larger group is trained in consecutive stacks of near-equal sizes, ``chunks``);
    None = no cap.

    ``checkpoint_every_s`` (with ``out_dir``): each stack writes a checkpoint under ``<out_dir>/partial/`` at
    evaluations once that many seconds have passed since its last (0: at every evaluation; None or negative:
    never), and on Ctrl-C (``runners.train.resume``); trained again, a stack goes on from its checkpoint to the same
    records. A run that had finished before is not trained again: its record is read from ``out_dir``.
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
        for chunk in chunks(members, max_stack or len(members)):
            done = _train_stack([runs[i] for i in chunk], [names[i] for i in chunk], out_dir=out_dir,
                                progress=progress, compile=compile, cuda_graph=cuda_graph,
                                compact_at=COMPILED_COMPACTION if compile else 1.0,
                                checkpoint_every_s=checkpoint_every_s)
            for i, record in zip(chunk, done):
                records[i] = record
    return records


@dataclasses.dataclass(eq=False, kw_only=True)
class _Run(RunLog):
    """One run of a stack: what train_run logs for its record, and its place in the stack's loop."""

    shuffle: torch.Generator
    epoch_shuffle: torch.Tensor | None = None  # shuffle's state before the current epoch's permutation
    done: bool = False  # record written; the run may still sit in the stack, frozen, until compaction
    lr: float = 0.0  # of its latest step

    @classmethod
    def of(cls, run: ResolvedRun, name: str | None) -> _Run:
        return cls(resolved=run, name=name, shuffle=shuffle_generator(run.config.train.init_seed))

    def state_dict(self, *, new_epoch: bool) -> dict[str, Any]:
        """The log's state dict, whether the run finished, and its shuffle generator's state before the permutation
        of the epoch its next step belongs to (``new_epoch``: that epoch starts with the next step, its permutation
        not drawn yet)."""
        shuffle = self.shuffle.get_state() if new_epoch else self.epoch_shuffle
        return {**super().state_dict(), "done": self.done, "shuffle": shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.done = state["done"]
        self.shuffle.set_state(state["shuffle"])


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


def _scored_stack(targets: list[torch.Tensor], device: torch.device
                  ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Targets [N, T] of each distinct data set, stacked for the device: (None, [U, N, T]) for dense tasks, or
    (positions, targets) [U, N, S] at the scored positions (runners.train.metrics), S the widest set's."""
    widths = [sparse_width(t) for t in targets]
    if any(w is None for w in widths):
        return None, torch.stack(targets).to(device)
    pairs = [scored_positions(t, max(widths)) for t in targets]
    return torch.stack([p for p, _ in pairs]).to(device), torch.stack([t for _, t in pairs]).to(device)


@torch.no_grad()
def _adamw_update(params: torch.Tensor, grads: Sequence[torch.Tensor], exp_avg: torch.Tensor,
                  exp_avg_sq: torch.Tensor, decay: torch.Tensor, step_size: torch.Tensor, bc2_sqrt: torch.Tensor,
                  beta1: float, beta2: float) -> None:
    """torch.optim.AdamW's step on flat [N, P] tensors, in its op order; grads are each parameter's [N, *shape]
    in the flat layout's order; per run decay = 1 - lr * wd and step_size = -lr / (1 - beta1^t) are [N],
    bc2_sqrt = sqrt(1 - beta2^t) is a 0-dim tensor."""
    # one concatenation, which compiled code fuses into the update, instead of a copy per parameter
    grads = torch.cat([g.reshape(g.shape[0], -1) for g in grads], dim=1)  # [N, P]
    params.mul_(decay[:, None])
    exp_avg.lerp_(grads, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(ADAM_EPS)
    params.add_(step_size[:, None] * exp_avg / denom)  # addcdiv's order: param + (value * m) / denom


class _Stack:
    """The state of the runs of a stack still training: flat parameters and AdamW moments [N, P], the data of
    every distinct data set on the device, and the batched step (eager, compiled or CUDA-graphed)."""

    def __init__(self, runs: list[ResolvedRun], device: torch.device, autocast: bool, compile: bool,
                 cuda_graph: bool) -> None:
        tc = runs[0].config.train
        self.device, self.autocast, self.cuda_graph = device, autocast, cuda_graph
        # the evaluation as a CUDA graph: with the step's graphs, and in compiled stacks (evaluate)
        self.graph_eval = cuda_graph or (compile and device.type == "cuda")
        self.beta1, self.beta2 = tc.beta1, tc.beta2
        self.template = _template(runs[0].model_config, device, folds_runs(device))
        self.names = [name for name, _ in self.template.named_parameters()]
        self.shapes = [p.shape for _, p in self.template.named_parameters()]
        self.n_params = models.count_parameters(self.template)

        flat = []
        for run in runs:
            # the init of train_run, on the CPU; the stack moves to the device
            model = initial_model(run.model_config, run.config.train.init_seed, torch.device("cpu"))
            named = dict(model.named_parameters())
            flat.append(torch.cat([named[name].detach().reshape(-1) for name in self.names]))
        self.params = torch.stack(flat).to(device)  # [N, P]
        self.exp_avg = torch.zeros_like(self.params)
        self.exp_avg_sq = torch.zeros_like(self.params)
        self.loss_acc = torch.zeros(len(runs), device=device)  # [N] training-loss sums since the last eval

        data_keys: dict[str, int] = {}
        train_sets, test_sets, index = [], [], []
        for run in runs:
            seed = run.config.train.data_seed
            key = json.dumps([run.config.task, dataclasses.asdict(run.task.params), seed], sort_keys=True,
                             default=str)
            if key not in data_keys:
                data_keys[key] = len(train_sets)
                train_data, test_data = run_data(run.task, run.config.train)
                train_sets.append(train_data)
                test_sets.append(test_data)
            index.append(data_keys[key])
        self.train_inputs = torch.stack([d.inputs for d in train_sets]).to(device)  # [U, num_train, T]
        # sparse tasks: as train_run, the head and the loss see only the scored positions [U, num_train, S]
        self.train_positions, self.train_targets = _scored_stack([d.targets for d in train_sets], device)
        self.test_inputs = torch.stack([d.inputs for d in test_sets]).to(device)  # [U, num_test, T]
        self.test_positions, self.test_targets = _scored_stack([d.targets for d in test_sets], device)
        self.data_index_host = torch.tensor(index)  # [N]: each run's data set
        self.data_index = self.data_index_host.to(device)
        # packed tasks: every row's document starts on the host [U, rows, slots], one slot count for the stack
        # (the most documents of any row), so each step's layouts [N, B * slots + 1] stack (train.packed_layout)
        self.train_starts = self.test_starts = None
        if train_sets[0].doc_ids is not None:
            slots = kernels.utils.max_docs_per_row(*(d.doc_ids for d in train_sets + test_sets))
            self.train_starts, self.test_starts = (
                torch.stack([kernels.utils.row_starts(d.doc_ids, slots) for d in sets])
                for sets in (train_sets, test_sets))

        # static shapes: vmap does not run on symbolic sizes (dynamic=None fails once a second shape shows up)
        self.compile = compile
        self.losses_fn = torch.compile(_batched_losses, dynamic=False) if compile else _batched_losses
        self.update_fn = torch.compile(_adamw_update, dynamic=False) if compile else _adamw_update
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        self.graph_pool = None
        # the evaluation's graph: (live rows, batch size), the graph, the sums it rewrites
        self.eval_graph: tuple[tuple[tuple[int, ...], int], torch.cuda.CUDAGraph, list[EvalSums]] | None = None

    def __len__(self) -> int:
        return self.params.shape[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The stack's training state on the CPU: flat parameters and AdamW moments [N, P], training-loss sums
        since the last evaluation [N]."""
        return {"params": self.params.detach().cpu(), "exp_avg": self.exp_avg.detach().cpu(),
                "exp_avg_sq": self.exp_avg_sq.detach().cpu(), "loss_acc": self.loss_acc.detach().cpu()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Put back a ``state_dict`` of a stack of these runs, in place."""
        for name, tensor in (("params", self.params), ("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq),
                             ("loss_acc", self.loss_acc)):
            tensor.copy_(state[name])

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view [N, *shape] of a flat [N, P] tensor."""
        views, start = [], 0
        for shape in self.shapes:
            size = math.prod(shape)
            views.append(flat[:, start : start + size].view(len(self), *shape))
            start += size
        return views

    def _leaves(self) -> list[torch.Tensor]:
        """The parameters' views of the flat parameters, as leaves that require grad."""
        return [view.requires_grad_() for view in self._views(self.params)]

    def layout(self, starts: torch.Tensor | None, rows: torch.Tensor | slice) -> torch.Tensor | None:
        """Each run's cu_seqlens [N, B * slots + 1] on the device for its rows (host idx [N, B], or one slice of
        the test set) of packed data (``starts``, [U, rows, slots]); None for unpacked tasks."""
        if starts is None:
            return None
        rows = torch.arange(starts.shape[1])[rows] if isinstance(rows, slice) else rows
        return packed_layout(starts[self.data_index_host[:, None], rows], self.train_inputs.shape[-1], self.device)

    def _step(self, idx: torch.Tensor, decay: torch.Tensor, step_size: torch.Tensor,
              bc2_sqrt: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> None:
        """One optimizer step of every run; idx [N, B] are the rows of each run's training set, cu_seqlens
        [N, B * slots + 1] their layouts (packed tasks)."""
        rows = (self.data_index[:, None], idx)
        inputs, targets = self.train_inputs[rows], self.train_targets[rows]  # [N, B, T], [N, B, T or S]
        positions = None if self.train_positions is None else self.train_positions[rows]  # [N, B, S]
        leaves = self._leaves()
        limit = torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT) if self.compile else nullcontext()
        with limit:
            losses = self.losses_fn(self.template, dict(zip(self.names, leaves)), inputs, targets, positions,
                                    self.autocast, not self.cuda_graph, cu_seqlens)  # [N]
            grads = torch.autograd.grad(losses.sum(), leaves)  # d(sum)/d(run n's params) = d(loss n)/d(...)
            self.update_fn(self.params, grads, self.exp_avg, self.exp_avg_sq, decay, step_size, bc2_sqrt,
                           self.beta1, self.beta2)
        self.loss_acc += losses.detach()

    def step(self, idx: torch.Tensor, decay: torch.Tensor, step_size: torch.Tensor,
             bc2_sqrt: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> None:
        if not self.cuda_graph:  # packed tasks (cu_seqlens) never take graphs: train_runs_batched refuses them
            self._step(idx, decay, step_size, bc2_sqrt, cu_seqlens)
            return
        if idx.shape[1] not in self.graphs:
            self._capture(idx, decay, step_size, bc2_sqrt)
        graph, static = self.graphs[idx.shape[1]]
        for name, value in (("idx", idx), ("decay", decay), ("step_size", step_size), ("bc2_sqrt", bc2_sqrt)):
            static[name].copy_(value)
        graph.replay()

    def _capture(self, idx: torch.Tensor, decay: torch.Tensor, step_size: torch.Tensor,
                 bc2_sqrt: torch.Tensor) -> None:
        """Capture the step for batches of idx.shape[1] rows; warm-up steps first, their effect undone."""
        static = {"idx": idx.clone(), "decay": decay.clone(), "step_size": step_size.clone(),
                  "bc2_sqrt": bc2_sqrt.clone()}
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

    def take_train_losses(self) -> list[float]:
        """Each run's sum of training losses since the last call (as floats), then reset the sums."""
        out = self.loss_acc.tolist()
        self.loss_acc.zero_()
        return out

    @torch.no_grad()
    def evaluate(self, run_tasks: list[tasks.Task], rows: list[int],
                 batch_size: int) -> list[dict[str, float]]:
        """Test metrics of the runs in these rows (of these tasks), as ``runners.train.evaluation.evaluate`` computes
        them; one forward serves the whole stack. With graph_eval the whole evaluation (every test batch and
        every run's sums) is captured once per set of rows and replayed: eager, its few thousand small
        launches cost more than the training steps between two evaluations (MAD evaluates every epoch)."""
        if not self.graph_eval:
            return [acc.metrics() for acc in self._eval_sums(run_tasks, rows, batch_size)]
        key = (tuple(rows), batch_size)
        if self.eval_graph is None or self.eval_graph[0] != key:  # the live rows only shrink: no older set returns
            self.eval_graph = (key, *self._capture_eval(run_tasks, rows, batch_size))
        _, graph, sums = self.eval_graph
        graph.replay()
        return [acc.metrics() for acc in sums]  # each reads the tensors the replay rewrote

    def _eval_sums(self, run_tasks: list[tasks.Task], rows: list[int], batch_size: int) -> list[EvalSums]:
        """Each run's sums over the test set, still on the device."""
        sums = [EvalSums(task) for task in run_tasks]
        params = dict(zip(self.names, self._views(self.params)))
        for batch in eval_batches(self.test_inputs.shape[1], batch_size):
            inputs = self.test_inputs[self.data_index, batch]  # [N, B, T]
            targets = self.test_targets[self.data_index, batch]  # [N, B, T or S]
            positions = None if self.test_positions is None else self.test_positions[self.data_index, batch]
            cu_seqlens = self.layout(self.test_starts, batch)
            with bf16_autocast(self.device, self.autocast, not self.graph_eval), _quiet_vmap_loops(self.device):
                logits = _stacked_logits(self.template, params, inputs, positions, cu_seqlens)  # [N, B, T or S, V]
            for n, acc in zip(rows, sums):
                acc.add(logits[n], targets[n])
        return sums

    def _capture_eval(self, run_tasks: list[tasks.Task], rows: list[int],
                      batch_size: int) -> tuple[torch.cuda.CUDAGraph, list[EvalSums]]:
        """The evaluation as a CUDA graph (one eager pass first, on a side stream, to warm the libraries up);
        the returned sums hold the graph's output tensors. It shares the training graphs' memory pool (one
        pool, not two, per stack: at sequence length 1024 each holds gigabytes), which is safe here: graphs
        replay one at a time on one stream, no training graph output outlives its replay (the state it
        updates lives outside the pool), and the evaluation's outputs are read before the next step."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._eval_sums(run_tasks, rows, batch_size)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            sums = self._eval_sums(run_tasks, rows, batch_size)
        self.graph_pool = graph.pool()
        return graph, sums

    def keep(self, rows: list[int]) -> None:
        """Keep only these runs (indices into the current stack), in this order."""
        index = torch.tensor(rows, device=self.device)
        self.params = self.params.index_select(0, index)
        self.exp_avg = self.exp_avg.index_select(0, index)
        self.exp_avg_sq = self.exp_avg_sq.index_select(0, index)
        self.loss_acc = self.loss_acc.index_select(0, index)
        self.data_index = self.data_index.index_select(0, index)
        self.data_index_host = self.data_index_host[rows]
        self.graphs.clear()  # captured graphs point at the old buffers
        self.eval_graph = None
        self.graph_pool = None


def _epoch_schedule(trains: list[TrainConfig], plan: StepPlan, first_step: int, device: torch.device
                    ) -> tuple[list[list[float]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-step AdamW scalars of the epoch's steps from first_step for the rows' training settings ``trains``: lrs
    [S][N] (floats), decay [S, N], step_size [S, N] and bc2_sqrt [S], computed in float64 as torch.optim.AdamW
    does, stored as fp32."""
    tc = trains[0]  # betas are equal within a stack
    lrs, decay, step_size, bc2_sqrt = [], [], [], []
    for s in range(first_step, first_step + plan.steps_from(first_step)):
        t = float(s + 1)  # AdamW's step count after this step
        row = [plan.lr(train, s) for train in trains]
        lrs.append(row)
        decay.append([1 - lr * train.weight_decay for lr, train in zip(row, trains)])
        step_size.append([-(lr / (1 - tc.beta1**t)) for lr in row])
        bc2_sqrt.append((1 - tc.beta2**t) ** 0.5)
    tensors = (torch.tensor(x, dtype=torch.float32).to(device) for x in (decay, step_size, bc2_sqrt))
    return (lrs, *tensors)


def _train_stack(resolved: list[ResolvedRun], names: list[str | None], *, out_dir: str | Path | None,
                 progress: bool, compile: bool, cuda_graph: bool, compact_at: float,
                 checkpoint_every_s: float | None = None) -> list[dict[str, Any]]:
    """Train runs of one group_key together; records in the order given. Finished runs leave the stack
    once at most ``compact_at`` of its rows still train (1.0: at once). With ``out_dir`` and
    ``checkpoint_every_s``, the stack goes on from its checkpoint and writes new ones (``runners.train.resume``)."""
    tc = resolved[0].config.train
    device = pick_device(tc.device)
    autocast = uses_bf16(tc.precision, device)
    runs = [_Run.of(run, name) for run, name in zip(resolved, names)]
    asked = {run.default_name(): run for run in runs}
    saver, saved = resume.Checkpoint.open(out_dir, {name: run.resolved.hash for name, run in asked.items()},
                                          every_s=checkpoint_every_s, loop="stack", device=device.type, bf16=autocast)
    rows = runs
    if saved is not None:
        # the checkpoint's rows in its order: the runs asked for (each with the config hash it was saved with), and
        # runs that finished before, which are resolved here
        rows = [asked.get(row["name"]) or _Run.of(resolve(RunConfig.from_dict(row["config"])), row["name"])
                for row in saved.rows]
    stack = _Stack([run.resolved for run in rows], device, autocast, compile, cuda_graph)
    loop = _Loop(stack, rows, StepPlan.of(tc), out_dir, compact_at)
    if saved is not None:
        loop.restore(saved)
    bar = tqdm(total=loop.plan.total_steps, initial=loop.step, disable=not progress, unit="step", dynamic_ncols=True,
               leave=False, desc=f"{resolved[0].config.task} {resolved[0].model_config.mixer} x{len(rows)}")
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
class _Epoch:
    """An epoch's permutations of the training rows, orders [N, num_train] on the device and on the host
    (``orders_host``: packed tasks lay their batches out there), and per step its AdamW scalars
    (``_epoch_schedule``), one column per row of the stack."""

    orders_host: torch.Tensor
    orders: torch.Tensor
    lrs: list[list[float]]
    decay: torch.Tensor
    step_size: torch.Tensor
    bc2_sqrt: torch.Tensor

    def keep(self, rows: list[int]) -> None:
        """Keep these rows' columns (as ``_Stack.keep``)."""
        index = torch.tensor(rows, device=self.orders.device)
        self.orders_host = self.orders_host[rows]
        self.orders = self.orders.index_select(0, index)
        self.decay, self.step_size = self.decay.index_select(1, index), self.step_size.index_select(1, index)
        self.lrs = [[lrs[n] for n in rows] for lrs in self.lrs]


@dataclasses.dataclass(eq=False)
class _Loop:
    """A stack's training loop and where it stands: ``step`` steps taken, ``loss_count`` of them since the last
    evaluation; ``rows`` are the stack's runs, row by row (finished runs stay, frozen, until a compaction);
    ``records`` those written so far, by ``id`` of their run."""

    stack: _Stack
    rows: list[_Run]
    plan: StepPlan
    out_dir: str | Path | None
    compact_at: float
    step: int = 0
    loss_count: int = 0
    records: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start_wall = time.perf_counter()
        self.clock = TrainClock(self.stack.device)

    @property
    def live(self) -> list[_Run]:
        return [run for run in self.rows if not run.done]

    def train(self, bar: tqdm, saver: resume.Checkpoint | None, interrupts: resume.Interrupts) -> None:
        """Step until every run has finished; checkpoint at evaluations when ``saver`` is due, and after the
        step in flight when ``interrupts`` has one pending (then raise KeyboardInterrupt)."""
        plan = self.plan
        while self.step < plan.total_steps and self.live:
            epoch_start = plan.epoch_of(self.step) * plan.steps_per_epoch
            epoch = self._draw(epoch_start)
            # from the epoch's first step, or from where a resumed stack left it
            for i in range(self.step - epoch_start, plan.steps_from(epoch_start)):
                self._step(epoch, i)
                bar.update(1)
                if plan.evaluates_after(self.step):
                    self._evaluate()
                    if not self.live:
                        return
                    self._compact(epoch)
                    bar.set_postfix(runs=len(self.live))
                    self.clock.restart()
                    if saver is not None and saver.due():
                        saver.write(self.snapshot())
                        self.clock.restart()  # writing is no training time
                if interrupts.pending:
                    saver.write(self.snapshot())
                    raise KeyboardInterrupt

    def _draw(self, epoch_start: int) -> _Epoch:
        """Each row's permutation of the epoch that starts at ``epoch_start``, and the epoch's schedule."""
        for run in self.rows:
            run.epoch_shuffle = run.shuffle.get_state()
        trains = [run.resolved.config.train for run in self.rows]
        orders = torch.stack([torch.randperm(train.num_train, generator=run.shuffle)
                              for train, run in zip(trains, self.rows)])
        schedule = _epoch_schedule(trains, self.plan, epoch_start, self.stack.device)
        return _Epoch(orders, orders.to(self.stack.device), *schedule)

    def _step(self, epoch: _Epoch, i: int) -> None:
        """Step ``i`` of the epoch for every row."""
        batch = self.plan.batch(i)
        self.stack.step(epoch.orders[:, batch], epoch.decay[i], epoch.step_size[i], epoch.bc2_sqrt[i],
                        self.stack.layout(self.stack.train_starts, epoch.orders_host[:, batch]))
        for run, lr in zip(self.rows, epoch.lrs[i]):
            run.lr = lr
        self.loss_count += 1
        self.step += 1

    def _evaluate(self) -> None:
        """Evaluate the live runs; write the records of those that end here."""
        live_rows = [n for n, run in enumerate(self.rows) if not run.done]
        share = self.clock.lap() / len(live_rows)
        train_losses = self.stack.take_train_losses()
        tc = self.rows[0].resolved.config.train
        metrics = self.stack.evaluate([self.rows[n].resolved.task for n in live_rows], live_rows, tc.eval_batch_size)
        for n, row_metrics in zip(live_rows, metrics):
            run = self.rows[n]
            run.train_time += share
            run.add_evaluation(row_metrics, epoch=self.plan.epoch_of(self.step - 1), step=self.step, lr=run.lr,
                               loss_sum=train_losses[n], loss_steps=self.loss_count)
            run.done = run.stopped_early or self.step == self.plan.total_steps
            if run.done:
                record = run.record(n_params=self.stack.n_params, device=self.stack.device, steps=self.step,
                                    start_wall=self.start_wall, named=self.out_dir is not None)
                if self.out_dir is not None:
                    write_record(self.out_dir, record)
                self.records[id(run)] = record
        self.loss_count = 0

    def _compact(self, epoch: _Epoch | None = None) -> None:
        """Drop the finished rows once at most ``compact_at`` of the stack still trains (and the epoch's
        columns of them)."""
        keep = [n for n, run in enumerate(self.rows) if not run.done]
        if len(keep) == len(self.rows) or len(keep) > len(self.rows) * self.compact_at:
            return
        self.stack.keep(keep)
        self.rows = [self.rows[n] for n in keep]
        if epoch is not None:
            epoch.keep(keep)

    def snapshot(self) -> resume.Snapshot:
        """Where the loop stands, as state dicts: the stack's and each row's."""
        lap_s = self.clock.lap()
        new_epoch = self.step % self.plan.steps_per_epoch == 0
        return resume.Snapshot(step=self.step, loss_count=self.loss_count, tensors=self.stack.state_dict(),
                               rows=[run.state_dict(new_epoch=new_epoch) for run in self.rows],
                               elapsed_s=time.perf_counter() - self.start_wall, lap_s=lap_s)

    def restore(self, saved: resume.Snapshot) -> None:
        """Continue from ``saved``, taken of a stack of these rows, in its row order; rows that finished since the
        snapshot are marked done (and dropped)."""
        self.stack.load_state_dict(saved.tensors)
        for run, state in zip(self.rows, saved.rows, strict=True):
            run.load_state_dict(state)
            run.done = run.done or state["name"] in saved.finished
        self.step, self.loss_count = saved.step, saved.loss_count
        self.start_wall -= saved.elapsed_s
        self.clock.start -= saved.lap_s
        self._compact()
