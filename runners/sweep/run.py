"""Sweeps: a grid of runs, each named by the hash of its resolved config, that survives crashes.

``run_sweep`` runs the missing runs of a plan (``plan.SweepPlan``, made by ``spec.SweepSpec.plan``
for a YAML grid or ``mad.mad_plan`` for the MAD protocol) into an output folder (``manifest``: ``sweep.json`` and
one record per finished run). Running the same sweep again skips every hash that already has a record, so a
crash, ``kill -9`` or Ctrl-C loses only the runs in flight.

How the runs train is ``SweepOptions``: the missing runs are grouped into jobs (``jobs.plan_jobs``), runs
that the batched engine can stack trained together; the local backend (``local_backend``) runs the jobs in this
process or in worker processes, the Ray backend (``ray_backend``) makes each job a Ray task. No option changes a
record, only which runs train now, where and how fast.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Literal

from mixlab.core.atomic import writable_folder
from mixlab.core.fields import NonNegativeFloat, NonNegativeInt, PositiveInt, check_dataclass
from mixlab.core.records import RUNS, finished_hashes
from mixlab.runners.sweep import local_backend, ray_backend
from mixlab.runners.sweep.jobs import DEFAULT_MAX_STACK, Job, plan_jobs
from mixlab.runners.sweep.manifest import write_manifest
from mixlab.runners.sweep.plan import SweepPlan
from mixlab.runners.train import resume
from mixlab.runners.train.speed import SPEEDS
from tqdm.auto import tqdm

BACKENDS = ("local", "ray")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepOptions:
    """How ``run_sweep`` trains a plan's missing runs; checked when made (ValueError naming the bad value).

    workers: the local backend keeps this many jobs going: 1 in this process, N > 1 in spawned processes
        (on a GPU they share it; each gets cores // N torch threads, cores = those this process may run on).
    limit: run at most this many of the missing runs (to fit a time budget; run again to continue).
    tasks: train only the missing runs of these tasks now (e.g. to finish some tasks for every model first);
        the manifest still holds the whole plan, so reports count the other runs as missing.
    models: likewise for these models (the spec's model names), e.g. to split one grid over two GPUs.
    settings: likewise for these settings (the manifest's setting labels, e.g. ``baseline``, ``seq_len=512``),
        e.g. to train the short rows of a MAD protocol in calls too short for its longest jobs.
    stop_after: seconds after which no new job starts; jobs in flight finish and the sweep returns (local
        backend). Under a hard time limit (a 10-minute GPU call), set it to the limit minus the longest job, so a
        kill at the limit does not throw away jobs that were nearly done.
    progress: a tqdm bar that counts runs, with an ETA.
    batch: the runs of a job trained stacked by the batched engine; False: one run per job with ``train_run``.
        max_stack: most runs a stack trains at once (its width); a job holds up to ``jobs.JOB_STACKS`` times as
        many, queued, each taking the row of a run that ended. speed: how the engine steps each stack
        (``runners.train.speed``: eager, compile, cuda-graph, compile+graph, or auto, picked per stack).
    backend: ``local``, or ``ray``: each job a Ray task (``runners.sweep.ray_backend``, options ``ray``, default
        ``RayOptions()``); needs ``pip install mixlab[ray]``, and workers must be 1 (Ray schedules the jobs by
        resources).
    cuda_devices: the local backend's workers go round-robin to these CUDA devices (indices as this process
        sees them), each worker seeing only its own as ``cuda``: one sweep uses every GPU of a host. Workers
        are processes then, also for workers=1; at least one worker per device.
    checkpoint_every: seconds between a stack's checkpoints in mid-training (``runners.train.resume``; 0: at every
        evaluation; None or negative: none), also written on Ctrl-C: the sweep run again goes on from them
        (local backend; Ray's jobs write no files).
    """

    workers: PositiveInt = 1
    limit: NonNegativeInt | None = None
    tasks: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None
    settings: tuple[str, ...] | None = None
    stop_after: NonNegativeFloat | None = None
    progress: bool = True
    batch: bool = True
    max_stack: PositiveInt = DEFAULT_MAX_STACK
    speed: Literal[SPEEDS] = "eager"
    backend: Literal[BACKENDS] = "local"
    ray: ray_backend.RayOptions | None = None
    cuda_devices: tuple[NonNegativeInt, ...] | None = None
    checkpoint_every: float | None = resume.DEFAULT_EVERY_S

    def __post_init__(self) -> None:
        check_dataclass(self)
        workers, backend, devices = self.workers, self.backend, self.cuda_devices
        if self.stop_after is not None and backend == "ray":
            raise ValueError("stop_after is for the local backend")
        if backend == "ray" and workers != 1:
            raise ValueError(f"workers={workers} is for the local backend; Ray runs as many jobs at once as its "
                             "resources allow (cpus_per_job, gpus_per_job)")
        if devices is not None:
            if not devices or len(set(devices)) != len(devices):
                raise ValueError(f"cuda_devices must be distinct non-negative device indices, got {list(devices)}")
            if backend != "local":
                raise ValueError("cuda_devices is for the local backend (Ray places jobs on GPUs itself)")
            if workers < len(devices):
                raise ValueError(f"workers={workers} cannot cover {len(devices)} cuda_devices: give each at "
                                 "least one worker")
        if not self.batch and self.speed != "eager":
            raise ValueError(f"speed={self.speed!r} needs the batched engine (batch=True)")

    @property
    def engine(self) -> dict[str, Any]:
        """``jobs.run_job``'s options: how each job trains."""
        return {"batch": self.batch, "speed": self.speed, "checkpoint_every_s": self.checkpoint_every}


class SweepInterrupted(BaseException):
    """Ctrl-C stopped a sweep; the workers are ended and every record on disk is whole. Its message is one
    line: how many of the plan's runs have records and how many remain (running the sweep again trains those).

    Like KeyboardInterrupt it is not an Exception, so code that catches Exception does not swallow a Ctrl-C.
    """

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"{done} of {total} runs have records, {total - done} remain")
        self.done, self.total = done, total


@dataclasses.dataclass(frozen=True)
class SweepResult:
    total: int
    skipped: int
    ran: int
    out_dir: Path
    not_started: int = 0  # runs left untouched because ``stop_after`` had passed


def run_sweep(plan: SweepPlan, out_dir: str | Path, options: SweepOptions | None = None) -> SweepResult:
    """Run every run of ``plan`` without a record in ``out_dir`` yet, as ``options`` says (default
    ``SweepOptions()``: every missing run, in this process, stacked).

    The missing runs are split into jobs (``plan_jobs``), each trained by one call of the engine
    (``jobs.run_job``). A run that raises stops the sweep (finished records stay); so does Ctrl-C, without
    partial records: it raises SweepInterrupted, which counts the records. With workers > 1, a job out of
    device memory beside others runs again alone after them (``local_backend.run_pool``). ``out_dir`` is made
    and checked (``writable_folder``) before anything trains.
    """
    options = options or SweepOptions()
    # checked before anything is written: the devices this process sees, and whether Ray is installed
    device_ids = None if options.cuda_devices is None else local_backend.visible_device_ids(options.cuda_devices)
    if options.backend == "ray":
        ray_backend.import_ray()
    for label, chosen in (("task", options.tasks), ("model", options.models), ("setting", options.settings)):
        planned = list(dict.fromkeys(r.meta[label] for r in plan.runs))
        unknown = [v for v in chosen or () if v not in planned]
        if unknown:
            raise ValueError(f"{label} {unknown[0]!r} is not in this sweep; its {label}s: {', '.join(planned)}")
    out = Path(out_dir)
    runs_dir = out / RUNS
    done = finished_hashes(out)
    skipped = sum(r.hash in done for r in plan.runs)
    chosen = [r for r in plan.runs if (not options.tasks or r.meta["task"] in options.tasks)
              and (not options.models or r.meta["model"] in options.models)
              and (not options.settings or r.meta["setting"] in options.settings)]
    todo = [r.hash for r in chosen if r.hash not in done][: options.limit]
    # the finished runs shape the jobs too: a stack stopped part-way is formed again and finds its checkpoint
    jobs = (plan_jobs(chosen, options.max_stack, todo=set(todo)) if options.batch
            else plan_jobs(chosen, 1, todo=set(todo), job_stacks=1))
    writable_folder(out)
    runs_dir.mkdir(exist_ok=True)
    write_manifest(out, plan)
    started = time.monotonic()

    def may_start() -> bool:
        return options.stop_after is None or time.monotonic() - started < options.stop_after

    ran = 0
    finished = 0  # runs of jobs that ended (trained now or found with records)
    # smoothing=0: the ETA uses the mean time per run so far; runs differ too much for a moving average.
    bar = tqdm(total=len(plan.runs), initial=skipped, disable=not options.progress, desc=plan.name, unit="run",
               dynamic_ncols=True, smoothing=0)

    def job_done(job: Job, trained: int) -> None:
        """Every run of ``job`` has its record now; ``trained`` of them were trained by this sweep."""
        nonlocal ran, finished
        ran += trained
        finished += len(job)
        bar.update(len(job))

    try:
        if options.backend == "ray":
            ray_backend.run_jobs(jobs, runs_dir, options.ray or ray_backend.RayOptions(), options.engine, job_done)
        else:
            local_backend.run_jobs(jobs, runs_dir, options.engine, job_done, may_start, workers=options.workers,
                                   device_ids=device_ids)
    except KeyboardInterrupt:
        planned = {r.hash for r in plan.runs}
        raise SweepInterrupted(len(finished_hashes(out) & planned), len(planned)) from None
    finally:
        bar.close()
    return SweepResult(total=len(plan.runs), skipped=skipped, ran=ran, out_dir=out,
                       not_started=sum(len(job) for job in jobs) - finished)
