"""Accuracy of a packed sweep's retrieval runs by query kind and by the query's distance from its document start.

    python scripts/packed_by_distance.py --preset packed_mq_small --models hyena,hyena_leaky --lr 3e-3 \
        --seed 0 --saved /tmp/packed_saved --out reproductions/packed/packed_mq_small_by_distance.csv

For each model, trains the preset's packed associative-retrieval run of that learning rate and seed with its
checkpoint saved (``runners.train.run.train_run(save=True)``: the same config, so the same record as the sweep's;
a checkpoint already in ``--saved`` is reused), then reads the saved model's test accuracy per kind (present
key, absent key answered NONE) and distance bin (``analysis.packed_queries.accuracy_by_distance``). A leak from
the previous document might show where it is nearest (small distances) or grow with the pairs a far query picks
among. Writes one CSV row per model, kind and bin, and prints them as a table.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from mixlab.analysis.packed_queries import KINDS, accuracy_by_distance, predictions
from mixlab.runners.sweep.spec import load_spec
from mixlab.runners.train.run import load_saved_run, train_run

TASK = "packed/associative_retrieval"
EDGES = (0, 4, 8, 16, 32, 64)


def saved_run(preset: str, model: str, lr: float, seed: int, saved: Path, device: str | None = None) -> Path:
    """The checkpoint of the preset's retrieval run of ``model`` at ``lr`` and ``seed``, trained if missing;
    ``device`` as the sweep's ``--device`` (part of the run's config, so of its name)."""
    runs = [r for r in load_spec(preset).plan(device=device).runs if r.meta["task"] == TASK and r.meta["model"] == model
            and r.meta["seed"] == seed and r.config.train.lr == lr]
    if len(runs) != 1:
        raise SystemExit(f"{preset} has {len(runs)} {TASK} runs of model {model!r} at lr {lr} and seed {seed}")
    path = saved / f"{runs[0].hash}.pt"
    if not path.exists():
        train_run(runs[0].config, out_dir=saved, run_name=runs[0].hash, progress=False, save=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="packed_mq_small")
    parser.add_argument("--models", default="hyena,hyena_leaky", help="comma-separated models of the preset")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--saved", type=Path, required=True, help="folder for the runs' records and checkpoints")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--device", help="as the sweep's --device (default: the preset's)")
    parser.add_argument("--edges", default=",".join(map(str, EDGES)),
                        help="distance bin edges, comma-separated (full size: 0,4,8,16,32,64,128,256,512,1024)")
    args = parser.parse_args()
    edges = tuple(int(e) for e in args.edges.split(","))
    rows, bins = [], []
    for model in args.models.split(","):
        saved = saved_run(args.preset, model, args.lr, args.seed, args.saved, args.device)
        model, test = load_saved_run(saved, device=args.device or "cpu")
        table = accuracy_by_distance(predictions(model, test), test, edges)
        bins = table["bins"]
        rows += [{"model": model, "lr": args.lr, "seed": args.seed, "kind": kind, "distance": label,
                  "accuracy": acc, "n": n}
                 for kind in KINDS for label, acc, n in zip(table["bins"], table[kind], table[f"n_{kind}"])]
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("| model | kind | " + " | ".join(f"distance {b}" for b in bins) + " |")
    for model in args.models.split(","):
        for kind in KINDS:
            cells = [f"{r['accuracy']:.3f} ({r['n']})" for r in rows if r["model"] == model and r["kind"] == kind]
            print(f"| {model} | {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
