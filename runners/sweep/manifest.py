"""A sweep's manifest, ``<out>/sweep.json``: the sweep's spec and every planned run (hash, config, labels), written
atomically when the sweep starts, beside the records of its finished runs (``core.records``); and the plan of a
sweep in a folder that may hold one already (``plan_for_folder``).

A folder holds one sweep: starting a different one there (another spec, seeds aside) is refused; adding seeds is
fine. Where the runs train (the device, workers, backend) is not part of what the sweep is: the same folder goes
on on the CPU or a GPU.

A run is named by the hash of its config as planned, and that config names a device (``TrainConfig.device``), so
records written under that rule keep their names: a folder's runs keep the device of the command that first
planned them (the manifest's ``spec.device``: None for a grid's own, else ``auto``, ``cpu`` or ``cuda``) in their
names, and a later command with another ``--device`` trains them there under those names
(``ResolvedRun.on_device``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mixlab.core.atomic import write_json_atomic
from mixlab.core.records import MANIFEST
from mixlab.runners.sweep.plan import SweepPlan
from mixlab.runners.train.precision import pick_device

MANIFEST_FORMAT = 1
# Spec keys that say where or how a sweep trains, not what it is.
WHERE = ("device",)


def read_manifest(out_dir: str | Path) -> dict[str, Any] | None:
    """``<out_dir>/sweep.json``, or None when the folder holds none; ValueError when it cannot be parsed."""
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise ValueError(f"{str(path)!r} is not a readable manifest") from None


def plan_for_folder(make_plan: Callable[[str | None], SweepPlan], out_dir: str | Path,
                    device: str | None) -> SweepPlan:
    """The plan ``make_plan(device)`` of a sweep to run in ``out_dir``, its runs named as the folder names them.

    A folder without a manifest: the plan as made. A folder with one: the runs are planned with the device its
    manifest names (so they keep their names: module docstring) and, when ``device`` plans them elsewhere, they
    train on the device of ``make_plan(device)``'s runs (``device`` None: the spec's own). A folder that holds
    another sweep is refused (ValueError naming what differs).
    """
    old = read_manifest(out_dir)
    if old is None:
        return make_plan(device)
    planned = old.get("spec", {}).get("device")
    named = make_plan(planned)
    check_same_sweep(out_dir, old, named)
    if device == planned:
        return named
    there = make_plan(device)
    runs = [dataclasses.replace(run, resolved=run.resolved.on_device(where.config.train.device))
            for run, where in zip(named.runs, there.runs, strict=True)]
    return dataclasses.replace(named, runs=runs)


def check_devices(plan: SweepPlan, out_dir: str | Path) -> None:
    """ValueError, before anything is written, when a device the plan's runs train on is not here (``cuda``
    without a GPU)."""
    for device in sorted({run.config.train.device for run in plan.runs}):
        try:
            pick_device(device)
        except ValueError as exc:
            raise ValueError(f"{exc}; nothing was written to {str(out_dir)!r} (its runs keep their names on any "
                             "device: train them here on cpu or auto)") from None


def write_manifest(out_dir: str | Path, plan: SweepPlan) -> Path:
    """Write ``<out_dir>/sweep.json`` atomically; refuse a folder that holds a different sweep.

    Runs that an earlier manifest of the same sweep listed (other seeds) stay listed, and so do their seeds. Each
    run is listed with the config it was planned with, which its hash names (``ResolvedRun.planned_config``).
    """
    path = Path(out_dir) / MANIFEST
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    spec = json.loads(json.dumps(plan.spec))
    runs = [{"hash": r.hash, "config": r.resolved.planned_config.to_dict(), "meta": r.meta} for r in plan.runs]
    created = now
    old = read_manifest(out_dir)
    if old is not None:
        check_same_sweep(out_dir, old, plan)
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


def check_same_sweep(out_dir: str | Path, old: Mapping[str, Any], plan: SweepPlan) -> None:
    """ValueError when the manifest ``old`` of ``out_dir`` is another sweep than ``plan``'s, naming the first
    part of the spec that differs."""
    if old.get("kind") != plan.kind:
        raise ValueError(f"{str(out_dir)!r} holds a different sweep ({old.get('name')!r}, {old.get('kind')}, not "
                         f"{plan.kind}); choose another output folder")
    before, now = _identity(old.get("spec", {})), _identity(json.loads(json.dumps(plan.spec)))
    if before != now:
        differ = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
        raise ValueError(f"{str(out_dir)!r} holds a different sweep ({old.get('name')!r}, {old.get('kind')}: its "
                         f"{', '.join(differ)} differ); choose another output folder")


def _identity(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What makes two specs the same sweep: everything but the seeds, where it trains (``WHERE``) and the words
    around it (a grid's description and reference, a MAD profile's summary and the paragraph made from it), so
    rewording them does not orphan a folder of finished runs."""
    same = {k: v for k, v in spec.items() if k not in ("seeds", "description", "reference", "profile_text", *WHERE)}
    if isinstance(same.get("profile"), Mapping):
        same["profile"] = {k: v for k, v in same["profile"].items() if k != "summary"}
    return same
