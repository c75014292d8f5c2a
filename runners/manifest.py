"""The sweep folder on disk: its manifest (``sweep.json``) and which runs have a finished record.

An output folder holds::

    <out>/sweep.json          manifest: the sweep's spec and every planned run (hash, config, labels),
                              written atomically when the sweep starts
    <out>/runs/<hash>.json    one record per finished run, written atomically by the run itself
    <out>/runs/records.jsonl.xz   records packed by ``mixlab archive`` (``archive_records``), one JSON line each

A record appears whole or not at all (temporary file, fsync, rename), so a crash, ``kill -9`` or Ctrl-C loses
only the runs in flight; a run is finished iff its ``<hash>.json`` is a record or the archive holds it. A folder
holds one sweep: starting a different one there (another spec, seeds aside) is refused; adding seeds is fine.

Why an archive: the committed reproductions travel with the working tree to every GPU call (64 MiB in all), and
a 200-epoch MAD record takes about 58 kB as JSON; xz packs a folder's records about 7x. A sweep goes on over an
archived folder as over any other (its archived runs count as finished) and writes its new records beside it.
"""

from __future__ import annotations

import datetime
import functools
import json
import lzma
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mixlab.runners.atomic import atomic_file, write_json_atomic
from mixlab.runners.sweep_plan import SweepPlan

MANIFEST = "sweep.json"
RUNS = "runs"
MANIFEST_FORMAT = 1
ARCHIVE = "records.jsonl.xz"


def finished_hashes(out_dir: str | Path) -> set[str]:
    """Hashes with a complete record under ``<out_dir>/runs``: a file that parses as a JSON record, or one in
    the folder's archive."""
    runs_dir = Path(out_dir) / RUNS
    return {path.stem for path in runs_dir.glob("*.json") if is_record(path)} | archived_records(runs_dir).keys()


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
    if not path.is_file():  # also when runs_dir is no folder: the caller says what is wrong with it
        return {}
    stat = path.stat()
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


def write_manifest(out_dir: str | Path, plan: SweepPlan) -> Path:
    """Write ``<out_dir>/sweep.json`` atomically; refuse a folder that holds a different sweep.

    Runs that an earlier manifest of the same sweep listed (other seeds) stay listed, and so do their seeds.
    """
    path = Path(out_dir) / MANIFEST
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    spec = json.loads(json.dumps(plan.spec))
    runs = [{"hash": r.hash, "config": r.config.to_dict(), "meta": r.meta} for r in plan.runs]
    created = now
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            raise ValueError(f"{str(path)!r} is not a readable manifest") from None
        if old.get("kind") != plan.kind or _identity(old.get("spec", {})) != _identity(spec):
            raise ValueError(f"{str(out_dir)!r} holds a different sweep ({old.get('name')!r}, "
                             f"{old.get('kind')}); choose another output folder")
        new = {r["hash"] for r in runs}
        runs = [r for r in old.get("runs", []) if r["hash"] not in new] + runs
        # the spec names every seed its runs cover, so a report's "n=" counts the seeds the folder plans
        # rather than those of the last command (say --seeds 1 for one task after --seeds 3 for another)
        if isinstance(spec.get("seeds"), list) and isinstance(old.get("spec", {}).get("seeds"), list):
            spec["seeds"] = sorted(set(spec["seeds"]) | set(old["spec"]["seeds"]))
        created = old.get("created", now)
    manifest = {"format": MANIFEST_FORMAT, "name": plan.name, "kind": plan.kind, "spec": spec, "runs": runs,
                "created": created, "updated": now, "argv": sys.argv}
    write_json_atomic(path, manifest)
    return path


def _identity(spec: Mapping[str, Any]) -> str:
    """What makes two specs the same sweep: everything but the seeds and the words around it (a grid's
    description and reference, a MAD profile's summary and the paragraph made from it), so rewording them
    does not orphan a folder of finished runs."""
    same = {k: v for k, v in spec.items() if k not in ("seeds", "description", "reference", "profile_text")}
    if isinstance(same.get("profile"), Mapping):
        same["profile"] = {k: v for k, v in same["profile"].items() if k != "summary"}
    return json.dumps(same, sort_keys=True)
