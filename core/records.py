"""The record store on disk: a folder's finished runs, as loose files and in its archive.

A sweep's output folder holds::

    <out>/sweep.json          manifest: the sweep's spec and every planned run (hash, config, labels), written by
                              the sweep (``runners.sweep.manifest``)
    <out>/runs/<hash>.json    one record per finished run, written atomically by the run itself
    <out>/runs/records.jsonl.xz   records packed by ``mixlab archive`` (``archive_records``), one JSON line each

A record appears whole or not at all (temporary file, fsync, rename: ``core.atomic``), so a crash, ``kill -9`` or
Ctrl-C loses only the runs in flight; a run is finished iff its ``<hash>.json`` is a record or the archive holds
it.

Why an archive: the committed reproductions travel with the working tree to every GPU call (64 MiB in all), and
a 200-epoch MAD record takes about 58 kB as JSON; xz packs a folder's records about 7x. A sweep goes on over an
archived folder as over any other (its archived runs count as finished) and writes its new records beside it.
"""

from __future__ import annotations

import functools
import json
import lzma
import os
import stat as stat_module
from pathlib import Path
from typing import Any

from mixlab.core.atomic import atomic_file

MANIFEST = "sweep.json"
RUNS = "runs"
ARCHIVE = "records.jsonl.xz"


def finished_hashes(out_dir: str | Path) -> set[str]:
    """Hashes with a complete record under ``<out_dir>/runs``: a file that parses as a JSON record, or one in
    the folder's archive."""
    runs_dir = Path(out_dir) / RUNS
    return {path.stem for path in record_files(runs_dir) if is_record(path)} | archived_records(runs_dir).keys()


def record_files(folder: str | Path) -> list[Path]:
    """The ``*.json`` files of ``folder``, sorted; none when it does not exist. A folder that cannot be listed
    raises PermissionError naming it (``Path.glob`` would find nothing there and say nothing)."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(Path(folder) / name for name in names if name.endswith(".json"))


def has_record(runs_dir: str | Path, name: str) -> bool:
    """Whether run ``name`` has its record in ``runs_dir``: ``<name>.json``, or in the archive."""
    return is_record(Path(runs_dir) / f"{name}.json") or name in archived_records(runs_dir)


def read_record(runs_dir: str | Path, name: str) -> dict[str, Any]:
    """Run ``name``'s record from ``<runs_dir>/<name>.json``, else from the archive (KeyError if neither)."""
    path = Path(runs_dir) / f"{name}.json"
    if is_record(path):
        return json.loads(path.read_text())
    return json.loads(archived_records(runs_dir)[name])


def archived_records(runs_dir: str | Path) -> dict[str, str]:
    """The records in ``<runs_dir>/records.jsonl.xz`` as {name: JSON text}; {} without an archive."""
    path = Path(runs_dir) / ARCHIVE
    try:
        stat = path.stat()
    except (FileNotFoundError, NotADirectoryError):  # also when runs_dir is no folder: the caller says what is wrong
        return {}
    except PermissionError as exc:  # runs_dir cannot be searched: it is the cause, not the archive it may not hold
        raise PermissionError(exc.errno, exc.strerror, str(runs_dir)) from None
    if not stat_module.S_ISREG(stat.st_mode):
        return {}
    return _read_archive(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read_archive(path: Path, _mtime_ns: int, _size: int) -> dict[str, str]:
    """The archive's lines by record name; cached per file version (a sweep asks once per run)."""
    lines = lzma.decompress(path.read_bytes()).decode().splitlines()
    return {json.loads(line)["name"]: line for line in lines}


def archive_records(out_dir: str | Path) -> tuple[int, int]:
    """Move the records ``<out_dir>/runs/*.json`` into the archive ``<out_dir>/runs/records.jsonl.xz`` (merged
    with what it holds, one line per record, sorted by name, so the same records give the same bytes); files
    that are not records stay. Returns (records moved in, records in the archive). The archive is written
    atomically before any file is removed."""
    runs_dir = Path(out_dir) / RUNS
    if not runs_dir.is_dir():
        raise ValueError(f"{str(out_dir)!r} has no {RUNS}/ folder: not a sweep's output")
    lines = dict(archived_records(runs_dir))
    moved = []
    for path in sorted(runs_dir.glob("*.json")):
        if is_record(path):
            record = json.loads(path.read_text())
            if record.get("name", path.stem) != path.stem:
                raise ValueError(f"{str(path)!r} holds the record of run {record.get('name')!r}, not {path.stem!r}")
            lines[path.stem] = json.dumps(record, separators=(",", ":"))
            moved.append(path)
    if moved:
        text = "".join(f"{lines[name]}\n" for name in sorted(lines))
        with atomic_file(runs_dir / ARCHIVE) as f:
            f.write(lzma.compress(text.encode(), preset=9))
        for path in moved:
            path.unlink()
    return len(moved), len(lines)


def is_record(path: Path) -> bool:
    """Whether ``path`` holds a finished run's record (a JSON object with ``final``): a run is finished iff
    its ``<hash>.json`` is one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "final" in record
