"""Checkpoints of a stack in mid-training, so a stack killed part-way (a GPU lent for ten minutes at a time)
goes on where it stopped, to the same records bit for bit.

A stack (``runners.train.engine``) trained with an output folder writes ``<out_dir>/partial/<key>-<stamp>.pt``
(``torch.save`` of plain tensors, lists and dicts, read back with ``weights_only=True``) and then ``<key>.json``,
which names that file and says which runs it holds, which wait in its queue and at which step it is. ``key``
hashes the sorted names of the runs the stack started with (its rows and its queue). It is written at
evaluations once ``every_s`` seconds have passed since the last (0: at every evaluation), and when the process is
interrupted (``Interrupts``), then removed when the stack ends. Each write goes to a new .pt and drops the older
ones only once the .json names the new one, so a process killed between the two files (a worker past the pool's
grace period) leaves the previous pair whole.

What it holds is the state the training loop gives (``Snapshot``), everything that makes the next steps the same:
the loop's step count, the stack's state dict (``engine._Stack``: stacked parameters, AdamW moments, training-loss
sums, one row per run, empty rows included), per row its run's state dict (None for an empty row): name, config
and log (``record.RunLog.state_dict``: history, best evaluation, early stop, training time), its own step count
and the steps summed since its last evaluation, and its shuffle generator's state before the permutation of the
epoch its next step belongs to (the loop draws that permutation again and skips the steps already taken); and the
names of the runs still queued, in order. The data, the initialisation and the learning rates follow from the
configs. A run trained alone (``runners.train.run.train_run``) is checkpointed the same way, as a stack of one
whose tensors are its model's and AdamW's state dicts. This module writes and reads those dicts and the files
around them; the loops give and take their contents. A checkpoint of another ``FORMAT`` (format 1 holds one step
plan for the whole stack and no queue) is not read: its stack starts over, with a one-line warning.

A stack trained again finds its checkpoint when every run asked for is a run of it with the same config hash
(in a row, queued, or finished with a record), and every run still training in it is asked for or has a record
by now. A sweep run again plans only the runs without records: the runs that finished since leave their rows
empty at load, and the next queued runs take them; queued runs not asked for any more are left out. Any other
checkpoint that shares a run is ignored with a warning, never mixed in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import signal
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from mixlab.core.atomic import atomic_file, write_json_atomic
from mixlab.core.records import has_record

PARTIAL = "partial"
# A sweep's default seconds between checkpoints: writing one costs well under a second, and a ten-minute GPU call
# stopped by its limit loses at most this much.
DEFAULT_EVERY_S = 120.0
# Version of the files' layout: a checkpoint of another version is ignored (with a warning) and its stack starts over.
FORMAT = 2


@dataclasses.dataclass
class Snapshot:
    """A training loop between two steps, as the loop gives it: its step count, its tensors (the state dict of a
    stack, or of a run's model and optimizer), one state dict per row, in the stack's row order (at least ``name``;
    None for an empty row), and the names of the runs waiting in its queue, in order. ``finished`` names live
    rows whose records were written after the snapshot."""

    step: int  # the loop's steps so far
    tensors: dict[str, Any]
    rows: list[dict[str, Any] | None]
    elapsed_s: float  # wall seconds of the loop so far
    lap_s: float  # training seconds since the last evaluation
    queue: list[str] = dataclasses.field(default_factory=list)
    finished: frozenset[str] = frozenset()


# What a checkpoint file holds of a Snapshot (``finished`` is learnt when it is loaded).
_SAVED = tuple(f.name for f in dataclasses.fields(Snapshot) if f.name != "finished")


def stack_key(names: Sequence[str]) -> str:
    """The file name of a stack's checkpoint: a hash of its runs' names, sorted."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


class Checkpoint:
    """The checkpoint file of one stack or run (module docstring): found or started by ``open``, written when
    ``due``, removed at the end."""

    def __init__(self, out_dir: Path, key: str, members: dict[str, str], every_s: float,
                 where: dict[str, Any]) -> None:
        self.out_dir, self.key, self.members, self.every_s, self.where = out_dir, key, members, every_s, where
        self.folder = out_dir / PARTIAL
        self.last = time.monotonic()

    @classmethod
    def open(cls, out_dir: str | Path | None, asked: Mapping[str, str], *, every_s: float | None, loop: str,
             device: str, bf16: bool) -> tuple[Checkpoint | None, Snapshot | None]:
        """The checkpoint of a stack of the runs ``asked`` ({record name: config hash}) writing records to
        ``out_dir`` and what it saved, if anything; ``loop`` (``stack`` or ``run``: what its tensors are),
        ``device`` (the type) and ``bf16`` must be the checkpoint's. (None, None) when checkpoints are off (no
        ``out_dir``, ``every_s`` None or negative)."""
        if out_dir is None or every_s is None or every_s < 0:
            return None, None
        out_dir = Path(out_dir)
        asked = dict(asked)
        where = {"loop": loop, "device": device, "bf16": bf16}
        for meta_path in sorted((out_dir / PARTIAL).glob("*.json")):
            found = _matching(meta_path, out_dir, asked, where)
            if found is not None:
                meta, saved = found
                return cls(out_dir, meta_path.stem, meta["members"], every_s, where), saved
        return cls(out_dir, stack_key(list(asked)), asked, every_s, where), None

    def _tensor_files(self) -> list[Path]:
        return [*self.folder.glob(f"{self.key}.pt"), *self.folder.glob(f"{self.key}-*.pt")]

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every_s

    def write(self, saved: Snapshot) -> None:
        """A new .pt, then the .json that names it, each atomically, then the older .pt files."""
        live = [row["name"] for row in saved.rows if row is not None]
        state = {"format": FORMAT, "members": self.members,
                 **{name: getattr(saved, name) for name in _SAVED}}
        pt = self.folder / f"{self.key}-{time.time_ns():x}.pt"
        with atomic_file(pt) as f:
            torch.save(state, f)
        write_json_atomic(self.folder / f"{self.key}.json", {
            "format": FORMAT, "members": self.members, "live": live, "queue": saved.queue, "step": saved.step,
            "pt": pt.name,
            **self.where, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        for old in self._tensor_files():
            if old != pt:
                old.unlink(missing_ok=True)
        self.last = time.monotonic()

    def remove(self) -> None:
        (self.folder / f"{self.key}.json").unlink(missing_ok=True)
        for pt in self._tensor_files():
            pt.unlink(missing_ok=True)


def _matching(meta_path: Path, out_dir: Path, asked: dict[str, str], where: dict[str, Any]
              ) -> tuple[dict[str, Any], Snapshot] | None:
    """The checkpoint's metadata and snapshot when it is the one of the stack ``asked`` ({name: config hash});
    None when it shares no run with it; a warning and None when it shares runs but does not match."""
    try:
        meta = json.loads(meta_path.read_text())
        members, live = meta["members"], set(meta["live"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # half-removed or foreign: nothing says it is this stack's
    if not asked.keys() & members.keys():
        return None
    why = _mismatch(meta, out_dir, asked, where)
    saved = None
    if why is None:
        try:
            state = torch.load(tensor_file(meta_path, meta), map_location="cpu", weights_only=True)
            saved = _snapshot_of(state)
            agree = (state["members"] == members and saved.queue == meta["queue"]
                     and {r["name"] for r in saved.rows if r is not None} == live)
        except Exception as exc:  # missing, cut short, foreign or refused by weights_only: not usable
            why = f"its .pt cannot be read ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        else:
            why = None if agree else "its .pt and .json disagree"
    if why is not None:
        warnings.warn(f"ignoring the checkpoint {str(tensor_file(meta_path, meta))!r}: {why}; the stack starts "
                      "from step 0 (delete the checkpoint to silence this)", stacklevel=4)
        return None
    return meta, dataclasses.replace(saved, finished=frozenset(live - asked.keys()))


def tensor_file(meta_path: Path, meta: Mapping[str, Any]) -> Path:
    """The .pt a checkpoint's .json names (``<stem>.pt`` for checkpoints written before the .json named it)."""
    return meta_path.parent / Path(meta.get("pt", f"{meta_path.stem}.pt")).name


def _mismatch(meta: Mapping[str, Any], out_dir: Path, asked: dict[str, str], where: dict[str, Any]) -> str | None:
    """Why a checkpoint that shares runs with the stack ``asked`` is not its checkpoint, or None."""
    if meta.get("format") != FORMAT:
        return f"it is in checkpoint format {meta.get('format', 1)}, and this mixlab reads format {FORMAT} only"
    members, live, queue = meta["members"], set(meta["live"]), set(meta["queue"])
    if {k: meta.get(k) for k in where} != where:
        return f"it was written for {', '.join(f'{k} {meta.get(k)}' for k in where)}, not for " \
               f"{', '.join(f'{k} {v}' for k, v in where.items())}"
    for name, hashed in asked.items():
        if name not in members:
            return f"run {name!r} is not one of its runs"
        if members[name] != hashed:
            return f"run {name!r} has another config there (hash {members[name]}, now {hashed})"
        if name not in live | queue and not has_record(out_dir, name):
            return f"run {name!r} finished there but has no record"
    for name in sorted(live - asked.keys()):
        if not has_record(out_dir, name):
            return f"its run {name!r} is still training there but is not asked for now"
    return None


def _snapshot_of(state: Mapping[str, Any]) -> Snapshot:
    return Snapshot(**{name: state[name] for name in _SAVED})


class Interrupts:
    """While training, a signal that would raise KeyboardInterrupt (Ctrl-C's SIGINT; SIGTERM in a sweep's
    worker, ``local_backend``) only sets ``pending``: the loop finishes its step (and the evaluation after
    it), checkpoints that consistent state and raises KeyboardInterrupt itself. A second such signal raises at
    once (to leave a long compilation), with no checkpoint. Off the main thread, or where another handler is
    installed (a worker ignores SIGINT), nothing changes."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, active: bool = True) -> None:
        self.active = active  # False: ``held`` holds nothing back (no checkpoint to write)
        self.pending = False

    def _handle(self, signum: int, frame: object) -> None:
        if self.pending:
            raise KeyboardInterrupt
        self.pending = True

    @contextlib.contextmanager
    def held(self) -> Iterator[Interrupts]:
        """Hold the signals back inside the block; one still pending when it ends raises KeyboardInterrupt."""
        previous = {}
        if self.active and threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signal.getsignal(signum) is signal.default_int_handler:
                    previous[signum] = signal.signal(signum, self._handle)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self.pending:
            raise KeyboardInterrupt
