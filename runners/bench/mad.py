"""``mixlab bench mad``: the MAD protocol's training throughput shape by shape, and what the whole protocol would
cost on this device.

The runs of a MAD profile (``runners.sweep.mad.mad_plan``) are grouped into jobs exactly as a sweep groups them
(``runners.sweep.jobs.plan_jobs``). What one optimizer step costs depends only on its *step shape*: the resolved
model (vocabulary, row length), the batch, the precision and how many runs share the stack; settings that differ
only in training-set size or in values (noisy recall's ``frac_noise``) share a step shape. For each step shape the
benchmark takes the first stack of its largest job (its first ``max_stack`` runs), trains it for ``steps`` steps
after a short warm-up call (which takes CUDA context, compilation and graph capture out of the timing), and trains
the job's first run alone in the plain loop (``train_run``) for the same steps. The correctness gate compares that
run's test loss alone and in the stack (``bench_train``'s gate).

Per step shape the table gives the stacked and the one-at-a-time train tokens/s (tokens of pure step time, as
the records' ``train_time_s`` measure it) and the GPU-minutes the protocol's runs of that shape would take at
each rate before early stops (every run its full ``epochs x num_train`` rows). The totals weight each shape by
its tokens: the protocol's mean rate is its total tokens over its total time. The FLOP floor counts 6 FLOP per
matmul weight and token (forward and backward) plus causal attention's ``6 d (T + 1)`` per attention layer and
token, over the bf16 matmul rate measured at the start (CUDA only). At the MAD model's head size of 8 the softmax's
exponentials, not the FLOPs, bound attention: the exponential floor counts ``(T + 1) / 2`` of them per head,
attention layer and token, once forward and once per backward pass, over the fp32 ``exp2`` rate of the special-
function units measured at the start (``utils.exp2_rate``, CUDA only). The two run on different units, so
a shape's floor is the larger of its two.

End to end (``sweep_epochs``): the same runs then go through ``run_sweep`` as ``mixlab mad run`` would train them
(``workers`` jobs at a time, every early stop and evaluation included), each run's epochs cut to ``sweep_epochs``
so the call fits a time budget; the shapes and stacks are the protocol's. The sweep's rate is the tokens its runs
trained over its wall time; the benchmark's prediction for the same tokens is each run's tokens at its shape's
stacked rate, summed. Their ratio says how much of the benchmark a real sweep keeps: stacks that shrink as runs
stop early, evaluations, process start, compilation and graph capture all count against it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from mixlab import models
from mixlab.core.fields import NonNegativeFloat, NonNegativeInt, PositiveInt, check_dataclass
from mixlab.core.records import RUNS
from mixlab.models.mixers.attention import Attention
from mixlab.runners.bench.train import WARMUP_STEPS, gate_text, kernel_backend_label, rel_loss_diff, timed
from mixlab.runners.bench.utils import exp2_rate, median_time_ms
from mixlab.runners.sweep.jobs import DEFAULT_MAX_STACK, Job, plan_jobs
from mixlab.runners.sweep.local_backend import _init_worker
from mixlab.runners.sweep.mad import get_profile, mad_plan
from mixlab.runners.sweep.plan import PlannedRun, SweepPlan
from mixlab.runners.sweep.run import SweepOptions, run_sweep
from mixlab.runners.train.config import RunConfig
from mixlab.runners.train.engine import train_runs_batched
from mixlab.runners.train.precision import pick_device, uses_bf16
from mixlab.runners.train.provenance import device_info, package_versions
from mixlab.runners.train.resolved import ResolvedRun
from mixlab.runners.train.run import train_run
from mixlab.runners.train.schedule import StepPlan
from mixlab.runners.train.speed import MODES, SPEEDS, mode_name, stack_modes
from torch import nn
from tqdm.auto import tqdm

# Test rows of the timed runs' one evaluation: it is not timed, so it only needs to exist.
BENCH_TEST_ROWS = 256
# Side of the bf16 matmul whose rate is the FLOP floor's ceiling.
MATMUL_SIDE = 8192


@dataclasses.dataclass
class StepShape:
    """The jobs of a profile whose steps cost the same, and what timing one of them measured."""

    task: str
    vocab_size: int
    seq_len: int
    jobs: list[Job]
    settings: set[str] = dataclasses.field(default_factory=set)
    # every task whose runs the shape holds: tasks with the same vocabulary and row length share a step's cost
    # (``task`` is the first of them, which the shape is sorted by)
    tasks: set[str] = dataclasses.field(default_factory=set)
    tokens: int = 0  # the protocol's training tokens over every run of these jobs, before early stops
    flop_per_token: float = 0.0
    exp_per_token: float = 0.0
    speed: str = ""  # the mode its stack ran in (runners.train.speed; auto resolved)
    stacked: float | None = None  # tokens/s
    alone: float | None = None
    gate: str = ""
    error: str = ""  # why timing this shape failed; its tokens are then left out of the totals
    skipped: bool = False  # not timed: the time budget (stop_after) ran out first

    @property
    def label(self) -> str:
        return f"{self.task} T={self.seq_len} V={self.vocab_size} x{self.jobs[0].stack_width}"


def _modules(model_config: models.ModelConfig) -> list[nn.Module]:
    """Every module of the model the config builds (the global RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        return list(models.build_model(model_config).modules())


def flop_per_token(model_config: models.ModelConfig, seq_len: int) -> float:
    """Training FLOP of one token (forward and backward): 6 per matmul weight, plus causal attention's score and
    value products, 2 d (T + 1) on average forward, three times that with the backward."""
    modules = _modules(model_config)
    weights = sum(m.weight.numel() for m in modules if isinstance(m, nn.Linear))
    attention_layers = sum(isinstance(m, Attention) for m in modules)
    return 6.0 * weights + attention_layers * 6.0 * model_config.d_model * (seq_len + 1)


def exp_per_token(model_config: models.ModelConfig, seq_len: int) -> float:
    """Softmax exponentials of one training token in causal attention: (T + 1) / 2 scores per head on average,
    one exponential each in the forward and in the Triton kernels' one-pass backward."""
    attention_layers = sum(isinstance(m, Attention) for m in _modules(model_config))
    return attention_layers * model_config.n_heads * (seq_len + 1) / 2 * 2


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """The device's measured rates that the floors divide by; None off CUDA."""

    matmul_tflops: float | None = None  # bf16 matmul
    exp2_per_s: float | None = None  # fp32 exp2 on the special-function units

    def flop_minutes(self, s: StepShape) -> float | None:
        return s.tokens * s.flop_per_token / (self.matmul_tflops * 1e12) / 60 if self.matmul_tflops else None

    def exp_minutes(self, s: StepShape) -> float | None:
        return s.tokens * s.exp_per_token / self.exp2_per_s / 60 if self.exp2_per_s else None


def matmul_tflops(device: torch.device) -> float | None:
    """Measured bf16 matmul rate of the device in TFLOP/s (the floor's ceiling); None off CUDA."""
    if device.type != "cuda":
        return None
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(MATMUL_SIDE, MATMUL_SIDE, device=device, dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    ms = median_time_ms(lambda: a @ b, repeats=200, device=device)
    return 2 * MATMUL_SIDE**3 / (ms * 1e-3) / 1e12


def step_shapes(jobs: Sequence[Job]) -> list[StepShape]:
    """Jobs grouped by what a step costs: resolved model config, input length, batch, precision and stack width."""
    shapes: dict[tuple, StepShape] = {}
    for job in jobs:
        first = job.runs[0]
        model_config, seq_len, tc = first.model_config, first.row_tokens, first.config.train
        key = (model_config, seq_len, tc.batch_size, tc.precision, tc.device, job.stack_width)
        shape = shapes.get(key)
        if shape is None:
            shape = shapes[key] = StepShape(task=first.config.task, vocab_size=model_config.vocab_size,
                                            seq_len=seq_len, jobs=[],
                                            flop_per_token=flop_per_token(model_config, seq_len),
                                            exp_per_token=exp_per_token(model_config, seq_len))
        shape.jobs.append(job)
        for run in job.runs:
            shape.tokens += run.config.train.epochs * run.config.train.num_train * seq_len
    return sorted(shapes.values(), key=lambda s: (s.task, s.vocab_size, s.seq_len, -s.jobs[0].stack_width))


def _timing_runs(job: Job, steps: int) -> list[ResolvedRun]:
    """The first stack of the job's runs (its width) cut to ``steps`` steps with one evaluation at the end, no early
    stop; enough training rows for those steps (a step's cost does not depend on how many rows it samples from)."""
    out = []
    for run in job.runs[: job.stack_width]:
        tc = run.config.train
        out.append(run.with_train(dataclasses.replace(tc, epochs=None, steps=steps, early_stop_acc=None, eval_every=0,
                                                      num_train=min(tc.num_train, steps * tc.batch_size),
                                                      num_test=min(tc.num_test, BENCH_TEST_ROWS))))
    return out


def _warm_runs(runs: Sequence[ResolvedRun], steps: int, warmup_steps: int) -> list[ResolvedRun]:
    """The untimed warm-up call's runs: the timed ones cut to ``min(steps, warmup_steps)`` steps."""
    return [run.with_train(dataclasses.replace(run.config.train, steps=min(steps, warmup_steps))) for run in runs]


def _shape_mode(shape: StepShape, runs: Sequence[ResolvedRun], speed: str) -> str:
    """The mode (not auto) the shape's stack runs in."""
    return mode_name(*stack_modes(speed, pick_device(runs[0].config.train.device), shape.seq_len,
                                  runs[0].auto_compiles))


def _measure(shape: StepShape, steps: int, speed: str, alone: bool, warmup_steps: int = WARMUP_STEPS) -> None:
    """Time the shape's largest job stacked (``speed``, resolved for the shape), and its first run alone; fill
    in the rates and the gate. The untimed warm-up call trains ``warmup_steps`` steps (compiles, captures)."""
    runs = _timing_runs(max(shape.jobs, key=len), steps)
    warm = _warm_runs(runs, steps, warmup_steps)
    tc = runs[0].config.train
    device = pick_device(tc.device)
    shape.speed = _shape_mode(shape, runs, speed)
    compile = MODES[shape.speed][0]
    train_runs_batched(warm, progress=False, speed=shape.speed)
    stacked, _ = timed(lambda: train_runs_batched(runs, progress=False, speed=shape.speed))
    tokens = len(runs) * steps * tc.batch_size * shape.seq_len
    shape.stacked = tokens / sum(r["train_time_s"] for r in stacked)
    if not alone:
        return
    train_run(warm[0], progress=False)
    solo = train_run(runs[0], progress=False)
    shape.alone = steps * tc.batch_size * shape.seq_len / solo["train_time_s"]
    bf16 = uses_bf16(tc.precision, device)
    shape.gate = gate_text(rel_loss_diff(stacked[0], solo), device, bf16, compiled=compile)


def compile_stack(runs: Sequence[ResolvedRun], speed: str) -> float:
    """Train ``runs`` (a shape's warm-up call) as one stack in ``speed``; seconds taken. Run in another
    process, it leaves the stack's compiled code in torch's on-disk caches (Inductor's FX graph and AOTAutograd
    caches, Triton's kernels), where the timing process finds it."""
    start = time.monotonic()
    train_runs_batched(list(runs), progress=False, speed=speed)
    return time.monotonic() - start


def precompile(shapes: Sequence[StepShape], speed: str, steps: int, warmup_steps: int, processes: int,
               deadline: float | None = None, executor: concurrent.futures.Executor | None = None) -> int:
    """Compile the compiled shapes of ``shapes`` ahead, ``processes`` at a time, in their order; returns how many
    compiled without error. None starts after ``deadline`` (``time.monotonic()``); those in flight then finish, so
    nothing compiles while the timing runs. ``executor``: where the warm-up calls run (default: a pool of
    ``processes`` spawned processes with this one's torch thread count)."""
    todo = []
    for shape in shapes:
        runs = _timing_runs(max(shape.jobs, key=len), steps)
        mode = _shape_mode(shape, runs, speed)
        if MODES[mode][0]:
            todo.append((_warm_runs(runs, steps, warmup_steps), mode))
    if not todo:
        return 0
    own = executor is None
    if own:
        # this process's thread count: Inductor's CPU code, and so its cache key, depends on it
        executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=processes, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
            initargs=(torch.get_num_threads(), os.getpid()))
    pending, in_flight, done = iter(todo), set(), 0
    try:
        while True:
            while len(in_flight) < processes and (deadline is None or time.monotonic() < deadline):
                item = next(pending, None)
                if item is None:
                    break
                try:
                    in_flight.add(executor.submit(compile_stack, *item))
                except concurrent.futures.BrokenExecutor:  # a process died (out of host memory): time what there is
                    pending = iter(())
                    break
            if not in_flight:
                return done
            finished, in_flight = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                # a shape that fails here (out of memory, a kernel) fails again when timed, which names it in its row
                if future.exception() is None:
                    done += 1
    finally:
        if own:
            executor.shutdown(wait=True, cancel_futures=True)


@dataclasses.dataclass
class EndToEnd:
    """What one real sweep over the benchmark's runs measured, beside the benchmark's prediction for it."""

    runs: int
    stopped_early: int
    tokens: int  # trained by every run, early stops included
    wall_s: float
    predicted_s: float  # the same tokens at each run's step-shape rate
    workers: int
    epochs: int

    @property
    def rate(self) -> float:
        return self.tokens / self.wall_s

    @property
    def predicted_rate(self) -> float:
        return self.tokens / self.predicted_s


def _rows_trained(record: dict) -> int:
    """Training rows a run's steps went through: whole epochs of num_train rows, then full batches (an epoch's
    last batch holds the rows left)."""
    train = RunConfig.from_dict(record["config"]).train
    epochs, steps = divmod(record["steps"], StepPlan.of(train).steps_per_epoch)
    return epochs * train.num_train + min(steps * train.batch_size, train.num_train)


def _capped(run: PlannedRun, epochs: int) -> PlannedRun:
    """The run with at most ``epochs`` epochs (its cosine spans them), renamed by its new hash; a prefix run (quick
    profile) becomes those epochs whole."""
    tc = run.config.train
    return PlannedRun(run.resolved.with_train(dataclasses.replace(tc, epochs=min(tc.epochs, epochs), steps=None)),
                      run.meta)


def end_to_end(runs: Sequence[PlannedRun], shapes: Sequence[StepShape], *, epochs: int, workers: int,
               max_stack: int, speed: str, progress: bool) -> EndToEnd:
    """Train ``runs`` (epochs cut to ``epochs``) with ``run_sweep`` in a scratch folder and time the whole sweep;
    each run's tokens are predicted at the stacked rate of the step shape its uncut run belongs to."""
    rate_of = {h: s.stacked for s in shapes if s.stacked for job in s.jobs for h in job.hashes}
    kept = [r for r in runs if r.hash in rate_of]  # a shape that failed in the benchmark has no prediction
    capped = [_capped(r, epochs) for r in kept]
    original = {c.hash: r.hash for c, r in zip(capped, kept)}
    plan = SweepPlan(name="bench-mad-end-to-end", kind="mad", spec={"bench": "mad", "epochs": epochs},
                     runs=capped)
    options = SweepOptions(workers=workers, max_stack=max_stack, speed=speed, progress=progress)
    with tempfile.TemporaryDirectory(prefix="mixlab-bench-mad-") as folder:
        start = time.perf_counter()
        run_sweep(plan, folder, options)
        wall = time.perf_counter() - start
        records = [json.loads(f.read_text()) for f in sorted((Path(folder) / RUNS).glob("*.json"))]
    tokens, predicted, stopped = 0, 0.0, 0
    for record in records:
        run_tokens = _rows_trained(record) * record["resolved"]["model"]["max_seq_len"]
        tokens += run_tokens
        predicted += run_tokens / rate_of[original[record["name"]]]
        stopped += bool(record["stopped_early"])
    return EndToEnd(runs=len(records), stopped_early=stopped, tokens=tokens, wall_s=wall, predicted_s=predicted,
                    workers=workers, epochs=epochs)


def _shape_row(s: StepShape, ceilings: Ceilings) -> str:
    """The table row of one step shape."""
    speedup = f"{s.stacked / s.alone:.1f}x" if s.alone else "-"
    verdict = f"FAILED {s.error}" if s.error else "not timed (stop_after)" if s.skipped else s.gate or "-"
    tasks = ", ".join(sorted(s.tasks or {s.task}))
    return (f"| {tasks} | {', '.join(sorted(s.settings))} | {s.vocab_size} | {s.seq_len} | {s.jobs[0].stack_width} | "
            f"{len(s.jobs)} | {s.speed or '-'} | {_fmt(s.stacked, ',.0f')} | {_fmt(s.alone, ',.0f')} | {speedup} | "
            f"{s.tokens / 1e6:,.1f} | {_fmt(_minutes(s.tokens, s.stacked), '.2f')} | "
            f"{_fmt(_minutes(s.tokens, s.alone), '.2f')} | {_fmt(ceilings.flop_minutes(s), '.2f')} | "
            f"{_fmt(ceilings.exp_minutes(s), '.2f')} | {verdict} |")


def _minutes(tokens: float, rate: float | None) -> float | None:
    return None if not rate else tokens / rate / 60


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchMadOptions:
    """What ``bench_mad`` times and how; checked when made (ValueError naming the bad value).

    device: auto, cpu or cuda. seeds: seeds planned (None: the profile's, as ``mad run`` plans them); stacks hold
        every seed of a setting's grid (``runners.sweep.jobs.plan_jobs``), so 3 seeds time the stacks of a 3-seed sweep.
    steps: timed steps a shape. warmup_steps: steps of the untimed call before (compilation, graph capture).
    tasks: only these MAD tasks (the stacks stay as the sweep forms them over those tasks). settings: only the
        step shapes holding one of these settings (e.g. ``baseline``, ``seq_len=512``); the rest are left out.
    max_stack: as the sweep's. speed: ``runners.train.speed`` (auto: each shape's mode from its row length).
    alone: also time one run of each shape in the plain loop, with the correctness gate.
    stop_after: seconds after which no shape starts timing (the one in flight finishes); the shapes not timed
        are named and left out of the totals, so a call fits a time limit. None: time every shape.
    heaviest_first: time the shapes in the order of their protocol tokens, most first, so a call cut short by
        stop_after covers most of the protocol (the table keeps its order).
    precompile: processes that first compile every compiled shape, in the timing order, into torch's on-disk
        caches (``precompile``), so each timing's warm-up finds its code there instead of compiling for 25-45 s
        on an H200; none start after half of stop_after (the timing keeps the other half), and none run while
        shapes are timed. 0: compile as each shape is timed.
    sweep_epochs, workers: then a real sweep of the timed shapes' runs cut to that many epochs, ``workers`` jobs
        at a time, against the benchmark's prediction (None: no sweep).
    progress: a bar over the shapes, and each row on stderr as soon as it is timed.
    """

    device: str = "auto"
    seeds: PositiveInt | None = None
    steps: PositiveInt = 30
    warmup_steps: PositiveInt = WARMUP_STEPS
    tasks: tuple[str, ...] | None = None
    settings: tuple[str, ...] | None = None
    max_stack: PositiveInt = DEFAULT_MAX_STACK
    speed: Literal[SPEEDS] = "eager"
    alone: bool = True
    stop_after: NonNegativeFloat | None = None
    heaviest_first: bool = False
    precompile: NonNegativeInt = 0
    sweep_epochs: PositiveInt | None = None
    workers: PositiveInt = 1
    progress: bool = True

    def __post_init__(self) -> None:
        check_dataclass(self)


def _chosen_shapes(model: str, profile: str, options: BenchMadOptions) -> tuple[list[PlannedRun], list[StepShape]]:
    """The plan's runs of ``options.tasks`` and their step shapes, as the sweep would stack them; only the
    shapes holding one of ``options.settings`` when given. ValueError names an unknown task or setting."""
    runs = mad_plan(model, profile, seeds=options.seeds, device=options.device).runs
    for label, chosen in (("task", options.tasks), ("setting", options.settings)):
        known = sorted({r.meta[label] for r in runs})
        unknown = [v for v in chosen or () if v not in known]
        if unknown:
            raise ValueError(f"unknown MAD {label} {unknown[0]!r}; choose from {', '.join(known)}")
        if label == "task" and chosen:
            runs = [r for r in runs if r.meta["task"] in chosen]
    shapes = step_shapes(plan_jobs(runs, max_stack=options.max_stack))
    setting_of = {r.hash: r.meta["setting"] for r in runs}
    task_of = {r.hash: r.meta["task"] for r in runs}
    for shape in shapes:
        shape.settings = {setting_of[h] for job in shape.jobs for h in job.hashes}
        shape.tasks = {task_of[h] for job in shape.jobs for h in job.hashes}
    if options.settings:
        shapes = [s for s in shapes if s.settings & set(options.settings)]
        if not shapes:
            raise ValueError(f"no step shape of tasks {list(options.tasks or [])} holds settings "
                             f"{list(options.settings)}")
    kept = {h for s in shapes for job in s.jobs for h in job.hashes}
    return [r for r in runs if r.hash in kept], shapes


def bench_mad(model: str = "transformer", profile: str = "paper", options: BenchMadOptions | None = None) -> str:
    """Markdown report: device and versions, one row per step shape of the profile (as ``options`` choose them),
    then the protocol's totals per seed over the shapes timed (those not timed are named); with
    ``sweep_epochs``, a real sweep of the same runs against the benchmark's prediction. Raises ValueError on a
    bad model, profile, task or setting."""
    options = options or BenchMadOptions()
    runs, shapes = _chosen_shapes(model, profile, options)
    seeds = len({r.meta["seed"] for r in runs})
    dev = pick_device(options.device)
    ceilings = Ceilings(matmul_tflops(dev), exp2_rate(dev))
    start = time.monotonic()
    order = sorted(shapes, key=lambda s: -s.tokens) if options.heaviest_first else shapes
    precompiled = 0
    if options.precompile:
        # compiling ahead takes at most half of stop_after, so the timing keeps the other half
        precompiled = precompile(order, options.speed, options.steps, options.warmup_steps, options.precompile,
                                 None if options.stop_after is None else start + options.stop_after / 2)
    for shape in (bar := tqdm(order, desc=f"bench mad {model}", unit="shape", disable=not options.progress)):
        if options.stop_after is not None and time.monotonic() - start >= options.stop_after:
            shape.skipped = True
            continue
        try:
            _measure(shape, options.steps, options.speed, options.alone, options.warmup_steps)
        except Exception as err:  # noqa: BLE001 - one shape that fails (out of memory, a kernel) must not hide the rest
            message = str(err).splitlines()[0][:160] if str(err) else ""
            shape.error, shape.stacked, shape.alone = f"{type(err).__name__}: {message}", None, None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        if options.progress:  # each row as soon as it is measured (stderr): a benchmark cut short keeps what it timed
            bar.write(_shape_row(shape, ceilings), file=sys.stderr)

    timed_shapes = [s for s in shapes if s.stacked]
    if not timed_shapes:
        raise ValueError("no step shape was timed: " + "; ".join(
            sorted({s.error for s in shapes if s.error} | ({"stop_after passed"} if shapes[0].skipped else set()))))
    e2e = None
    if options.sweep_epochs is not None:
        e2e = end_to_end(runs, shapes, epochs=options.sweep_epochs, workers=options.workers,
                         max_stack=options.max_stack, speed=options.speed, progress=options.progress)
    first = shapes[0].jobs[0].runs[0]
    model_config = first.model_config
    bf16 = uses_bf16(first.config.train.precision, dev)
    info, versions = device_info(dev), package_versions(model_config)
    fields = ", ".join(f"{f.name}={getattr(options, f.name)!r}" for f in dataclasses.fields(options)
                       if f.name != "progress")
    lines = [
        f"# MAD protocol throughput: model {model}, profile {profile}, {seeds} seed(s), speed {options.speed}",
        "",
        f"{datetime.date.today().isoformat()}, device: {info['name']} ({dev.type}), torch {versions['torch']}, "
        f"CUDA {torch.version.cuda or 'none'}, triton {versions['triton']}, python {versions['python']}, "
        f"precision {'bf16 autocast' if bf16 else 'fp32'}, kernels {kernel_backend_label(model_config)}"
        + (f", bf16 matmul {ceilings.matmul_tflops:.0f} TFLOP/s measured" if ceilings.matmul_tflops else "")
        + (f", fp32 exp2 {ceilings.exp2_per_s / 1e12:.2f}T/s measured" if ceilings.exp2_per_s else ""),
        f"bench_mad(model={model!r}, profile={profile!r}, {fields})",
        get_profile(profile).describe(),
        f"{len(runs)} runs in {sum(len(s.jobs) for s in shapes)} jobs of {len(shapes)} step shapes; each shape's "
        f"largest job timed for {options.steps} steps; GPU-minutes are for all {seeds} seed(s), before early stops."
        + (f" {precompiled} shape(s) compiled ahead by {options.precompile} process(es) before the timing."
           if options.precompile else ""),
        "",
        "| tasks | settings | V | T | runs/stack | jobs | speed | stacked tok/s | alone tok/s | speed-up "
        "| protocol Mtok | min stacked | min alone | min floor | min exp floor | gate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_shape_row(s, ceilings) for s in shapes),
        "",
        *_totals(shapes, timed_shapes, seeds, ceilings, options.alone),
    ]
    if e2e is not None:
        lines += [
            "",
            f"End to end: `run_sweep` of these {e2e.runs} runs, epochs cut to {e2e.epochs}, {e2e.workers} worker(s): "
            f"{e2e.stopped_early} stopped early, {e2e.tokens / 1e6:,.1f}M tokens trained in {e2e.wall_s:.3g} s of "
            f"wall time = {e2e.rate:,.0f} tokens/s; the shapes' stacked rates predict {e2e.predicted_s:.3g} s "
            f"({e2e.predicted_rate:,.0f} tokens/s): the sweep keeps {e2e.predicted_s / e2e.wall_s:.0%} of the "
            f"benchmark.",
        ]
    return "\n".join(lines) + "\n"


def _totals(shapes: Sequence[StepShape], timed_shapes: Sequence[StepShape], seeds: int, ceilings: Ceilings,
            alone: bool) -> list[str]:
    """The totals' lines over the timed shapes, after naming every shape left out of them (failed, not timed)."""
    total_tokens = sum(s.tokens for s in timed_shapes)
    stacked_min = sum(_minutes(s.tokens, s.stacked) for s in timed_shapes)
    alone_min = sum(_minutes(s.tokens, s.alone) for s in timed_shapes) if alone else None
    floor_min = sum(ceilings.flop_minutes(s) for s in timed_shapes) if ceilings.matmul_tflops else None
    exp_min = sum(ceilings.exp_minutes(s) for s in timed_shapes) if ceilings.exp2_per_s else None
    slowest = min(timed_shapes, key=lambda s: s.stacked)
    planned = sum(s.tokens for s in shapes)
    lines = []
    for what, left in (("failed (gate column)", [s for s in shapes if s.error]),
                       ("were not timed (stop_after passed first)", [s for s in shapes if s.skipped])):
        if left:
            lines.append(f"{len(left)} step shape(s) {what}: {'; '.join(s.label for s in left)}. Their tokens, "
                         f"{sum(s.tokens for s in left) / planned:.1%} of those planned here, are left out of the "
                         "totals below.")
    scope = "every step shape" if len(timed_shapes) == len(shapes) else \
        f"the {len(timed_shapes)} of {len(shapes)} step shapes timed"
    lines += [
        f"Totals over {scope} ({seeds} seed(s), {total_tokens / 1e9:.2f}G training tokens): token-weighted mean "
        f"{total_tokens / (stacked_min * 60):,.0f} tokens/s stacked; slowest shape {slowest.stacked:,.0f} tokens/s "
        f"({slowest.task}, T={slowest.seq_len}, V={slowest.vocab_size}).",
        f"Estimated device-minutes per seed before early stops, over {scope}: stacked {stacked_min / seeds:.1f}, "
        f"one run at a time {_fmt(alone_min and alone_min / seeds, '.1f')}, "
        f"FLOP floor {_fmt(floor_min and floor_min / seeds, '.2f')}, attention's exponential floor "
        f"{_fmt(exp_min and exp_min / seeds, '.2f')}.",
    ]
    return lines
