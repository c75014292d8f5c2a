"""A sweep's manifest, ``<out>/sweep.json``: the sweep's spec and every planned run (hash, config, labels), written
atomically when the sweep starts, beside the records of its finished runs (``core.records``).

A folder holds one sweep: starting a different one there (another spec, seeds aside) is refused; adding seeds is
fine.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mixlab.core.atomic import write_json_atomic
from mixlab.core.records import MANIFEST
from mixlab.runners.sweep.plan import SweepPlan

MANIFEST_FORMAT = 1


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
