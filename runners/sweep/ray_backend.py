"""Sweeps on a Ray cluster (``mixlab sweep ... --backend ray``): each job of a sweep is one Ray task.

Ray is optional (``pip install mixlab[ray]``): this module imports it only when a sweep runs on it.

Where results go: a task trains its job's runs on its worker, writes nothing there, and returns their records;
the driver (the process running the sweep) writes each to ``<out>/runs/<hash>.json`` atomically, as the local
backend does. Workers need no shared filesystem, so a remote cluster (``address``) works as a local one, and
the folder keeps the local rule: a run is finished iff its record exists; running the sweep again trains only
the missing runs. A record carries the worker's device and the driver's ``argv``.

Retries: a task whose worker dies (killed, out of memory, node lost) runs again from the start on another
worker, up to ``max_retries`` times (Ray's task retries). Nothing of a dead task reached the driver, so its
job's runs are trained again from scratch, and each record is written once: the driver never rewrites a hash
that has a record. An exception from training (a bad config) is not retried: it stops the sweep, as on the
local backend. Ctrl-C on the driver cancels the tasks in flight; finished records stay.

The cost of returning records: a job's records arrive when the whole job ends, so a dead or cancelled task
loses all of its job, runs that stopped early included; a job's size (``jobs.plan_jobs``) bounds that loss.

Resources: a job asks Ray for ``cpus_per_job`` CPUs (torch uses that many threads in the task), plus
``gpus_per_job`` GPUs (a fraction lets jobs share a GPU) when its runs' device is ``cuda``, or ``auto`` on a
cluster with GPUs. Every node needs mixlab installed (the same version as the driver) and the cluster's Ray.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from mixlab.core.atomic import write_json_atomic
from mixlab.core.fields import NonNegativeInt, PositiveFloat, PositiveInt, check_dataclass
from mixlab.core.records import is_record
from mixlab.runners.sweep.jobs import Job, run_job

INSTALL_HINT = "pip install 'mixlab[ray]'"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayOptions:
    """How a sweep uses Ray.

    address: the cluster (``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``); None: ``ray.init``'s default,
        the cluster in ``RAY_ADDRESS``, else one started on this machine by ``ray start``, else a new local
        instance, shut down after the sweep. A driver already connected (``ray.init`` in a notebook) is used
        as it is, and stays connected.
    cpus_per_job: CPUs each job asks for (and torch threads it uses).
    gpus_per_job: GPUs each job on ``cuda`` asks for, at most 1 (a job trains on one device); below 1, jobs
        share a GPU (0.25: four per GPU).
    max_retries: times a job whose worker died is run again.
    """

    address: str | None = None
    cpus_per_job: PositiveInt = 1
    gpus_per_job: PositiveFloat = 1.0
    max_retries: NonNegativeInt = 3

    def __post_init__(self) -> None:
        check_dataclass(self)
        if self.gpus_per_job > 1:
            raise ValueError(f"RayOptions.gpus_per_job must be in (0, 1] (a job trains on one GPU), "
                             f"got {self.gpus_per_job!r}")


def import_ray() -> ModuleType:
    """The ``ray`` module, or ValueError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"the ray backend needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def job_resources(job: Job, options: RayOptions, cluster_gpus: float) -> dict[str, float]:
    """Ray resources of one job: CPUs always; GPUs for ``cuda`` runs, and ``auto`` runs on a GPU cluster."""
    if job.device == "cuda" and cluster_gpus == 0:
        raise ValueError(f"runs with device 'cuda' ({job.label}) need a GPU, and the Ray cluster has none")
    use_gpu = job.device == "cuda" or (job.device == "auto" and cluster_gpus > 0)
    return {"num_cpus": options.cpus_per_job, "num_gpus": options.gpus_per_job if use_gpu else 0}


def train_job(job: Job, engine: dict[str, Any], threads: int) -> list[dict[str, Any]]:
    """A task's body: train ``job`` on this worker with torch on ``threads`` threads; return the records."""
    torch.set_num_threads(threads)
    return run_job(job, None, **engine)


def store_records(records: Sequence[dict[str, Any]], job: Job, runs_dir: Path) -> int:
    """Write the records a job's task returned, except where a hash has a record already; return how many."""
    expected = set(job.hashes)
    written = 0
    for record in records:
        name = record["name"]
        if name not in expected:
            raise ValueError(f"a task of job {job.label} returned a record for {name!r}, not one of its runs")
        path = runs_dir / f"{name}.json"
        if is_record(path):
            continue
        # the worker's argv is Ray's; the command that ran the sweep is the driver's, as on the local backend
        write_json_atomic(path, {**record, "argv": sys.argv})
        written += 1
    return written


def run_jobs(jobs: Sequence[Job], runs_dir: Path, options: RayOptions, engine: dict[str, Any],
             job_done: Callable[[Job, int], None]) -> None:
    """Run every job as a Ray task and write the records it returns into ``runs_dir`` as each job ends;
    ``job_done(job, records written)`` after each. The first failed job cancels the others and raises."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=options.address, logging_level="WARNING")
    try:
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
        resources = [job_resources(job, options, cluster_gpus) for job in jobs]
        task = ray.remote(train_job)
        pending = {}
        for job, res in zip(jobs, resources):
            ref = task.options(**res, max_retries=options.max_retries, retry_exceptions=False,
                               name=f"mixlab {job.label}").remote(job, engine, options.cpus_per_job)
            pending[ref] = job
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    job = pending.pop(ref)
                    try:
                        records = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        # raise the training error itself (a ValueError's one line is the CLI's message),
                        # with the task's remote traceback chained
                        if isinstance(exc.cause, Exception):
                            raise exc.cause from exc
                        raise
                    job_done(job, store_records(records, job, runs_dir))
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()
