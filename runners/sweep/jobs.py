"""Jobs: the runs of a sweep that one call of the engine trains, and ``run_job``, which trains one.

``plan_jobs`` groups the missing runs of a sweep: runs that the batched engine (``runners.train.engine``) can stack
(equal ``job_key``) make one job, trained as one stack of at most ``max_stack`` runs at once with the others
queued (each run that ends hands its row to the next); a key with more than ``JOB_STACKS`` stacks' worth of runs
is cut into several jobs. A run that cannot stack is a job alone. A stacked run's record equals the one it would
get alone (on the CPU bitwise, time fields aside), so the grouping changes no result. Both backends
(``local_backend``, ``ray_backend``) run these jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from mixlab.core.fields import PositiveInt, check
from mixlab.core.records import has_record
from mixlab.runners.sweep.plan import PlannedRun
from mixlab.runners.train.engine import train_runs_batched
from mixlab.runners.train.resolved import ResolvedRun
from mixlab.runners.train.run import train_run
from mixlab.runners.train.schedule import StepPlan

# Runs a stack trains at once: bounds device memory and the share of a stack that one step's launches serve.
DEFAULT_MAX_STACK = 64
# A job holds at most this many stacks' worth of runs: its queue keeps the stack full for most of them (only the
# last runs' tail is trained by a stack emptying out), while a key of very many runs still makes several jobs,
# for several workers and devices, and a failed job leaves the others' records.
JOB_STACKS = 4


@dataclasses.dataclass(frozen=True)
class Job:
    """Runs trained by one call of the engine: runs of equal ``job_key``, stacked ``width`` at a time (None: all
    at once) with the rest queued, or one run that cannot stack. Its runs are resolved
    (``runners.train.resolved``), each named by its hash, and pickle as they are to a spawned process or to a Ray
    task, which train them without resolving again."""

    runs: tuple[ResolvedRun, ...]
    width: int | None = None

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def hashes(self) -> list[str]:
        return [run.hash for run in self.runs]

    @property
    def stack_width(self) -> int:
        """Runs its stack trains at once."""
        return min(self.width or len(self), len(self))

    @property
    def device(self) -> str:
        """The runs' ``device`` setting as written (``auto``, ``cpu`` or ``cuda``; equal within a job)."""
        return self.runs[0].config.train.device

    @property
    def tokens(self) -> int:
        """Training tokens of its runs if none stops early: what the job costs, to start long jobs first."""
        return sum(StepPlan.of(run.config.train).rows_trained * run.row_tokens for run in self.runs)

    @property
    def label(self) -> str:
        """``<task> <mixer> x<runs>`` of the first run, for progress and task names."""
        run = self.runs[0]
        return f"{run.config.task} {run.model_config.mixer} x{len(self)}"


def job_key(run: ResolvedRun) -> tuple:
    """Runs with equal keys may share a job: the run's ``stack_key`` plus the device and precision as written,
    which fix the rest of the engine's key (``engine.group_key``) wherever the job runs. A planner without a GPU
    can so group runs for ``cuda`` (a driver of a Ray cluster); the engine groups them the same on the worker."""
    return run.stack_key, run.config.train.device, run.config.train.precision


def chunks(members: Sequence[int], most: int) -> list[list[int]]:
    """``members`` in order, cut into the fewest chunks of at most ``most``, their sizes differing by at most one:
    300 runs at 256 make 150 and 150, not 256 and 44 (the two take as long)."""
    count = -(-len(members) // most)
    size, extra = divmod(len(members), count)
    bounds = [0]
    for n in range(count):
        bounds.append(bounds[-1] + size + (n < extra))
    return [list(members[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]


def plan_jobs(runs: Sequence[PlannedRun], max_stack: int = DEFAULT_MAX_STACK,
              todo: Collection[str] | None = None, job_stacks: int = JOB_STACKS) -> list[Job]:
    """Runs of equal ``job_key`` in plan order, in the fewest jobs of at most ``job_stacks * max_stack`` runs whose
    sizes differ by at most one (``chunks``), each stacked ``max_stack`` at a time: a setting's grid, its seeds, and
    the settings of equal step shapes (training-set sizes, lengths, evaluation schedules may differ) share a job.
    A run the engine cannot stack (``ResolvedRun.unbatchable_reason``: RubiConv on Triton, the fla baselines on
    packed tasks) is a job of its own. Jobs are ordered by their first run, so the first jobs hold the plan's
    first runs (its first seeds).

    ``todo``: the hashes to train now; the other runs (finished ones) still take their places in the jobs, which
    then drop them, so a sweep run again forms the jobs it formed before, at the same widths, less their finished
    runs, and each finds its checkpoint (``runners.train.resume``). Jobs left empty are dropped."""
    max_stack = check("max_stack", max_stack, PositiveInt)
    job_stacks = check("job_stacks", job_stacks, PositiveInt)
    groups: dict[tuple, list[int]] = {}
    for i, run in enumerate(runs):
        key = ("alone", run.hash) if run.resolved.unbatchable_reason is not None else job_key(run.resolved)
        groups.setdefault(key, []).append(i)
    planned = sorted(chunk for members in groups.values() for chunk in chunks(members, job_stacks * max_stack))
    jobs = [Job(tuple(runs[i].resolved for i in chunk if todo is None or runs[i].hash in todo),
                width=min(max_stack, len(chunk))) for chunk in planned]
    return [job for job in jobs if job.runs]


def run_job(job: Job, runs_dir: str | Path | None, *, batch: bool = True, speed: str = "eager",
            checkpoint_every_s: float | None = None) -> list[dict[str, Any]]:
    """Train the runs of ``job`` that have no record in ``runs_dir`` yet; return their records.

    Each record goes to ``<runs_dir>/<hash>.json`` (atomically) as soon as its run ends, so a job run again
    (resumed after a crash, or retried) trains only its missing runs and never writes a run twice. runs_dir
    None: nothing is skipped or written (the Ray backend's tasks; the driver writes). batch: the runs
    trained stacked by ``engine.train_runs_batched``, ``job.width`` at a time (with its ``speed``,
    ``runners.train.speed``); False: one at a time by ``train_run``. checkpoint_every_s: the engine's checkpoints of
    a stack in mid-training (``runners.train.resume``; with runs_dir only), so a job run again goes on where it
    stopped.
    """
    if not batch and speed != "eager":
        raise ValueError(f"speed={speed!r} is an option of the batched engine; it needs batch=True")
    todo = [run for run in job.runs if runs_dir is None or not has_record(runs_dir, run.hash)]
    if not todo:
        return []
    names = [run.hash for run in todo]
    if batch:
        return train_runs_batched(todo, out_dir=runs_dir, run_names=names, progress=False, speed=speed,
                                  max_stack=job.width, checkpoint_every_s=checkpoint_every_s)
    return [train_run(run, out_dir=runs_dir, run_name=run.hash, progress=False, checkpoint_every_s=checkpoint_every_s)
            for run in todo]
