"""The local backend of a sweep: its jobs in this process, or in worker processes on this machine.

``run_jobs`` trains the jobs one after another in this process, or keeps ``workers`` spawned processes busy
(``run_pool``), each pinned to one CUDA device when the sweep names several (``--cuda-devices``, ``all``: every
device this process sees), the workers spread round-robin over them. The pool starts the longest jobs first, so
every device has work while any remains and the last jobs to end are short ones. A job that runs out of device
memory beside others runs again alone after them; Ctrl-C or a failed run ends every worker at once (each
checkpoints its stack first).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from mixlab.runners.sweep.jobs import Job, run_job
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

# Seconds a stopped sweep waits for its workers to checkpoint their stacks (they finish the step in flight
# first) before it kills them.
STOP_GRACE_S = 60.0
# How often (s) the pool's wait for a finished job looks for a stop request (_wait_first).
WAIT_POLL_S = 0.2


def run_jobs(jobs: Sequence[Job], runs_dir: Path, engine: dict[str, Any], job_done: Callable[[Job, int], None],
             may_start: Callable[[], bool], *, workers: int = 1, device_ids: Sequence[str] | None = None) -> None:
    """Train ``jobs`` in order, ``job_done(job, runs trained)`` after each; a job starts only while
    ``may_start()``. One worker and no pinned devices: in this process; else in worker processes (``run_pool``).
    ``engine``: ``run_job``'s options."""
    if workers == 1 and device_ids is None:
        for job in jobs:
            if not may_start():
                return
            job_done(job, len(run_job(job, runs_dir, **engine)))
        return
    run_pool(jobs, runs_dir, workers, engine, job_done, may_start, device_ids=device_ids)


def every_device() -> list[int]:
    """The index of every CUDA device this process sees (``--cuda-devices all``); ValueError when it sees none."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        raise ValueError("--cuda-devices all: this process sees no CUDA device")
    return list(range(count))


def visible_device_ids(cuda_devices: Sequence[int]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entry of each of this process's device indices (its own list maps them when
    set, as in a sweep pinned to some GPUs of a host); an index it does not see raises ValueError."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in visible.split(",")] if visible else None
    count = torch.cuda.device_count() if torch.cuda.is_available() else len(ids) if ids else None
    if count is not None and max(cuda_devices) >= count:
        raise ValueError(f"cuda_devices {list(cuda_devices)} names a device this process does not see "
                         f"({count} visible)")
    return [ids[d] if ids else str(d) for d in cuda_devices]


def _take_device(device_ids: Sequence[str], started: Synchronized) -> str:
    """The device of the next worker to start: round-robin over ``device_ids`` by ``started``, a counter
    shared by the pool's workers."""
    with started.get_lock():
        index = started.value
        started.value += 1
    return device_ids[index % len(device_ids)]


def _init_worker(threads: int, parent: int, device_ids: Sequence[str] | None = None,
                 started: Synchronized | None = None) -> None:
    # The parent handles Ctrl-C and ends the workers; a worker ended mid-run has not written its record.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # started with the parent's stop signals blocked (_stop_signals_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    # tqdm's default lock is a multiprocessing semaphore, registered with the resource tracker that the workers
    # share with the parent: a worker ended mid-run would leave it registered, and the tracker would warn of a
    # leaked semaphore when the sweep exits. A worker's bars are off; a thread lock is all it needs.
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(threads)
    if device_ids:
        # before this process touches CUDA: its one device becomes "cuda" (cuda:0) for every run it trains
        os.environ["CUDA_VISIBLE_DEVICES"] = _take_device(device_ids, started)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """End this worker once the sweep process is gone (kill -9): it would otherwise wait for work forever,
    holding its memory and GPU context."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def start_order(jobs: Sequence[Job]) -> list[Job]:
    """The jobs longest first (``Job.tokens``; ties in the order given): a pool that starts them so ends with
    short jobs, instead of one device still training a long job that started last while the others idle."""
    return sorted(jobs, key=lambda job: -job.tokens)


class JobOutOfMemory(RuntimeError):
    """A job of a sweep ran out of device memory (its message: the allocator's first line)."""


def run_in_worker(job: Job, runs_dir: str, engine: dict[str, Any]) -> int:
    """A worker's body: train ``job`` (``run_job``); return how many runs it trained. Out of device memory, it
    raises JobOutOfMemory, which the pool tells from other failures.

    The pool ends its workers with SIGTERM (Ctrl-C, a failed run): while a job trains, SIGTERM raises
    KeyboardInterrupt, so the engine checkpoints its stack first (``runners.train.resume``), then the worker exits."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return len(run_job(job, runs_dir, **engine))
    except KeyboardInterrupt:
        os._exit(1)
    except torch.OutOfMemoryError as exc:
        message = str(exc).splitlines()[0]
    finally:
        signal.signal(signal.SIGTERM, previous)
    # out of the except block, the failed job's frames and tensors are gone: give their cached blocks back to
    # the device, for the other workers that share it
    torch.cuda.empty_cache()
    raise JobOutOfMemory(message)


# The signals that stop a sweep: Ctrl-C, and SIGTERM, which the CLI turns into the same KeyboardInterrupt
# (runners.cli.main.main; kill, timeout and batch schedulers send it).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (blocked) in this thread inside the block, delivered when it ends. A worker
    started inside inherits the mask, so a Ctrl-C at the terminal cannot kill it with a traceback before its
    initializer ignores SIGINT (and unblocks SIGTERM, by which the pool ends it); and a second stop signal
    cannot break off the pool's cleanup, leaving workers running and a traceback from inside
    concurrent.futures."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _StopRequest:
    """Whether a stop signal came: ``handle`` (a signal handler) sets ``requested``, nothing else. It takes no
    lock, as ``threading.Event.set`` does: under load the second of ``timeout -s INT``'s two signals can land
    while the handler of the first still runs, which runs the handler again inside itself, and the inner call
    waited forever on the lock the outer one held. A hyena sweep on a busy H200 host so ignored the stop, its
    workers still training, until timeout killed it 75 s later."""

    def __init__(self) -> None:
        self.requested = False

    def handle(self, signum: int, frame: object) -> None:
        self.requested = True


@contextlib.contextmanager
def _stop_requests() -> Iterator[_StopRequest]:
    """Inside the block a stop signal whose handler raises KeyboardInterrupt (Ctrl-C's, and SIGTERM's under
    ``runners.cli.main.main``) sets the request it yields instead, and ``_wait_first`` raises between two waits. Raised
    by the handler, a signal lands wherever the main thread is: a second one inside
    ``concurrent.futures.wait``'s re-taking of its condition's lock (``timeout -s INT`` signals the command and
    then its process group, so it sends two) left that lock released twice on an H200 run, and the sweep ended
    in ``RuntimeError: release unlocked lock`` instead of its one-line message."""
    stop = _StopRequest()
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set in the main thread
        yield stop
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is signal.default_int_handler:
            signal.signal(sig, stop.handle)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_first(futures: Iterable[concurrent.futures.Future],
                stop: _StopRequest) -> set[concurrent.futures.Future]:
    """The futures of ``futures`` that are done, waiting until one is; KeyboardInterrupt once ``stop`` is
    requested."""
    while True:
        finished, _ = concurrent.futures.wait(futures, timeout=WAIT_POLL_S,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
        if stop.requested:
            raise KeyboardInterrupt
        if finished:
            return finished


def run_pool(jobs: Sequence[Job], runs_dir: Path, workers: int, engine: dict[str, Any],
             job_done: Callable[[Job, int], None], may_start: Callable[[], bool],
             run: Callable[[Job, str, dict[str, Any]], int] = run_in_worker,
             device_ids: Sequence[str] | None = None) -> None:
    """Keep ``workers`` jobs in flight and nothing queued behind them, so a stop abandons only those; a new
    job starts only while ``may_start()``, the longest first (``start_order``). With ``device_ids``
    (``visible_device_ids``) worker k sees only device ``device_ids[k % len(device_ids)]``.

    A job that runs out of device memory beside others (jobs share a GPU) does not stop the sweep: it runs
    again after the other jobs, alone (it keeps the records its early-stopped runs wrote); out of memory
    alone, it stops the sweep like any failure. ``run`` trains a job in a worker (tests replace it)."""
    before = set(multiprocessing.active_children())
    # the cores this process may use (taskset, cgroup cpusets), not the machine's: sweeps pinned side by side
    # must not each start a thread per core
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // workers)
    context = multiprocessing.get_context("spawn")
    executor = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_init_worker,
        initargs=(threads, os.getpid(), device_ids, context.Value("i", 0)))
    pending = iter(start_order(jobs))
    in_flight: dict[concurrent.futures.Future, Job] = {}
    deferred: list[Job] = []  # ran out of memory beside other jobs: again, alone, once the rest is done
    alone: set[concurrent.futures.Future] = set()

    def start(job: Job) -> concurrent.futures.Future:
        with _stop_signals_held():  # the pool may start a worker here
            future = executor.submit(run, job, str(runs_dir), engine)
        in_flight[future] = job
        return future

    def submit(n: int) -> None:
        for _ in range(n):
            if not may_start():
                return
            job = next(pending, None)
            if job is None:
                if deferred and not in_flight:  # the rest is done: a deferred job, alone
                    alone.add(start(deferred.pop(0)))
                return
            start(job)

    with _stop_requests() as stop:
        try:
            submit(workers)
            while in_flight:
                for future in _wait_first(in_flight, stop):
                    job = in_flight.pop(future)
                    try:
                        trained = future.result()
                    except JobOutOfMemory as exc:
                        if future in alone:
                            raise
                        deferred.append(job)
                        tqdm.write(f"out of memory beside other jobs ({exc}); the job of {len(job)} runs runs again "
                                   "alone after the others")
                    else:
                        job_done(job, trained)
                    submit(1)
        except BaseException:
            # Ctrl-C or a failed run: end the other workers now instead of waiting for their runs.
            with _stop_signals_held():
                executor.shutdown(wait=False, cancel_futures=True)
                children = set(multiprocessing.active_children()) - before
                for child in children:
                    child.terminate()
                deadline = time.monotonic() + STOP_GRACE_S
                killed = 0
                for child in children:  # each writes its stack's checkpoint, then exits
                    child.join(max(0.0, deadline - time.monotonic()))
                    if child.is_alive():
                        child.kill()
                        killed += 1
                executor.shutdown(wait=True)  # reaps the ended workers and releases the pool's locks
                if killed:
                    tqdm.write(f"{killed} of {len(children)} workers had not stopped {STOP_GRACE_S:g} s after the stop "
                               "and were killed: their stacks go on from their last periodic checkpoint, if any")
            raise
    executor.shutdown(wait=True)
