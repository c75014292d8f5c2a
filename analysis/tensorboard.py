"""Run records as TensorBoard scalars: ``mixlab run``, ``sweep``, ``mad run`` and ``compare`` with ``--log
tensorboard DIR`` (the optional extra ``mixlab[tensorboard]``).

A record's evaluation history (``runners.train.record``) becomes one TensorBoard run, ``DIR/<run>``: at each
evaluation's step the test accuracies (``test/acc_macro``, ``test/acc_micro`` and the task's score groups,
``test/acc_<group>``), ``test/loss``, ``test/ppl``, and the mean training loss since the evaluation before,
``train/loss``, with the learning rate, ``train/lr``. A single run is named by its record; a sweep's runs by their
labels (``<task>/<model> <grid points>/seed=<seed> <hash>``), so TensorBoard's run filter picks a model, a task or
a seed. A run is logged once, when its record is written: its folder under ``DIR`` existing means it is logged,
so a resumed sweep logs only the runs it adds. During a sweep ``logging_sweep`` watches the folder's records (the
engine's workers write them wherever they train) and logs each as it appears.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mixlab.core.records import MANIFEST, RUNS, finished_hashes, read_record

KINDS = ("tensorboard",)
INSTALL_HINT = "pip install 'mixlab[tensorboard]'"
# Seconds between two looks at a sweep's records while it trains.
WATCH_EVERY_S = 10.0


def writer_class() -> type:
    """TensorBoard's ``SummaryWriter`` (``torch.utils.tensorboard``); ValueError saying what to install when the
    tensorboard package is missing, so a command fails before it trains."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError(f"--log tensorboard needs the tensorboard package: {INSTALL_HINT}") from None
    return SummaryWriter


def log_target(option: tuple[str, str] | None) -> Path | None:
    """The folder of ``--log KIND DIR`` (None when not given), checking the kind and that the writer imports."""
    if option is None or option == (None, None):
        return None
    kind, folder = option
    if kind not in KINDS:
        raise ValueError(f"--log takes {' or '.join(KINDS)} and a folder, got {kind!r}")
    writer_class()
    return Path(folder)


def scalars(entry: Mapping[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one evaluation of a record's history (module docstring)."""
    out = {f"test/{k}": entry[k] for k in entry if k.startswith("acc_")}
    out.update({"test/loss": entry.get("test_loss"), "test/ppl": entry.get("test_ppl"),
                "train/loss": entry.get("train_loss"), "train/lr": entry.get("lr")})
    return {tag: float(value) for tag, value in out.items() if value is not None}


def run_label(record: Mapping[str, Any], meta: Mapping[str, Any] | None) -> str:
    """A record's TensorBoard run: its name, or for a sweep's run its labels (module docstring)."""
    if meta is None:
        return str(record["name"])
    points = [_point(meta.get(k) or {}) for k in ("model_grid", "train_grid")]
    setting = meta.get("setting", "default")
    cell = " ".join([meta["model"], *(p for p in points if p), *([setting] if setting != "default" else [])])
    return f"{meta['task']}/{cell}/seed={meta['seed']} {record['name']}"


def _point(point: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def log_records(records: Iterable[Mapping[str, Any]], log_dir: str | Path,
                metas: Mapping[str, Mapping[str, Any]] | None = None, writer: type | None = None) -> list[str]:
    """Log each record not logged yet into ``log_dir``; returns the runs it logged. ``metas``: a sweep's labels by
    record name; ``writer``: a SummaryWriter-like class (default ``writer_class()``)."""
    writer = writer or writer_class()
    logged = []
    for record in records:
        label = run_label(record, (metas or {}).get(record["name"]))
        folder = Path(log_dir) / label
        if folder.is_dir():
            continue
        folder.mkdir(parents=True)
        log = writer(log_dir=str(folder))
        try:
            for entry in record.get("history") or []:
                for tag, value in scalars(entry).items():
                    log.add_scalar(tag, value, global_step=entry["step"])
        finally:
            log.close()
        logged.append(label)
    return logged


def log_sweep(folder: str | Path, log_dir: str | Path, writer: type | None = None) -> list[str]:
    """Log every finished run of a sweep folder (its records, archived ones too) not logged yet."""
    folder = Path(folder)
    runs = folder / RUNS
    manifest = json.loads((folder / MANIFEST).read_text()) if (folder / MANIFEST).is_file() else {}
    metas = {run["hash"]: run["meta"] for run in manifest.get("runs", [])}
    records = (read_record(runs, name) for name in sorted(finished_hashes(folder)))
    return log_records(records, log_dir, metas, writer)


@contextlib.contextmanager
def logging_sweep(folder: str | Path, log_dir: Path | None, every_s: float = WATCH_EVERY_S,
                  writer: type | None = None) -> Iterator[None]:
    """While the block trains a sweep into ``folder``, log each record as it appears (a look every ``every_s``
    seconds, in a thread), and every one left at the end, also when the block raises (Ctrl-C). Nothing when
    ``log_dir`` is None."""
    if log_dir is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(every_s):
            # a look that fails (no manifest yet, a full disk) leaves its runs to the next look or to the last one,
            # which raises what still fails: training goes on meanwhile
            with contextlib.suppress(Exception):
                log_sweep(folder, log_dir, writer)

    thread = threading.Thread(target=watch, name="tensorboard", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        log_sweep(folder, log_dir, writer)
