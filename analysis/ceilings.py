"""Accuracy ceilings that a task's data sets for a model class, computed from the data before any training.

Variable-length-key MQAR (SPEC 3.2, ``tasks.mqar_varlen``) read by ONE attention layer with a causal width-W conv
on its keys: at the separator of a pair's second occurrence the layer must output the pair's value, and the only
position whose value vector holds that token is the value's position in the context (a causal conv there sees
nothing later). So the query must find that position by its key vector, which sees the W tokens ending there:
the value, the separator (it encodes the key's length) and at most the last W - 2 key tokens. Two pairs of a row
whose keys have the same length and the same last W - 2 tokens are one key to the layer; values are drawn
independently of keys, so among m such pairs any rule is right with probability 1 / m on average. The ceiling
is the mean of 1 / m over every scored query. A conv of width >= longest key + 2, or a second layer, lifts it.

    python -m mixlab.analysis.ceilings --preset mqar_varlen_fig2 --windows 2,3,4,5   # the ceiling of each width
    python -m mixlab.analysis.ceilings --checkpoint runs/<run>.pt --windows 4       # a trained run's accuracy by m
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
from mixlab.tasks import get_task
from mixlab.tasks.base import IGNORE, Role, TaskData
from torch import nn


def query_multiplicity(data: TaskData, window: int) -> torch.Tensor:
    """m [N, T] (int64): at each scored query separator of ``mqar_varlen`` data, how many context pairs of its row
    (its own included) look like its pair through a width-``window`` key conv at the value (module docstring);
    0 at every other position. W = 1 (no conv) is given the separator as well, which only lowers m."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    inputs, targets, roles = (t.numpy() for t in (data.inputs, data.targets, data.roles))
    visible = max(window - 2, 0)  # key tokens in the window beside the value and the separator
    m = np.zeros(inputs.shape, dtype=np.int64)
    for r, (row_in, row_tgt, row_role) in enumerate(zip(inputs, targets, roles, strict=True)):
        seps = np.flatnonzero(row_role == Role.SEPARATOR)
        lengths = row_in[seps]  # SEP_L has id L
        signatures = [(int(n), tuple(row_in[s - min(int(n), visible) : s].tolist())) for s, n in zip(seps, lengths)]
        scored = row_tgt[seps] != IGNORE
        context = Counter(sig for sig, q in zip(signatures, scored) if not q)
        for s, sig, q in zip(seps, signatures, scored):
            if q:
                m[r, s] = context[sig]
    return torch.from_numpy(m)


def mqar_varlen_window_ceiling(data: TaskData, window: int) -> float:
    """Best expected query accuracy of one attention layer whose keys see ``window`` tokens: the mean of 1 / m
    over the scored queries (``query_multiplicity``). Returns a float in (0, 1]."""
    m = query_multiplicity(data, window)
    m = m[m > 0].double()
    if m.numel() == 0:
        raise ValueError("the data has no scored query")
    return float((1.0 / m).mean())


@torch.no_grad()
def accuracy_by_multiplicity(model: nn.Module, data: TaskData, window: int,
                             batch_size: int = 256) -> list[dict[str, float]]:
    """A trained model's query accuracy split by ``query_multiplicity``: one row per m with the queries' count
    ``n``, the model's accuracy ``acc`` and the best possible ``1 / m``. If the window explains the ceiling,
    ``acc`` is near 1 at m = 1 and near 1 / m above."""
    m = query_multiplicity(data, window)  # [N, T]
    correct = torch.zeros(m.shape, dtype=torch.bool)
    model.eval()
    for start in range(0, len(data), batch_size):
        rows = slice(start, start + batch_size)
        logits = model(data.inputs[rows])  # [B, T, V]
        correct[rows] = logits.argmax(-1) == data.targets[rows]
    return [{"m": int(k), "n": int((m == k).sum()), "acc": float(correct[m == k].double().mean()), "best": 1.0 / k}
            for k in torch.unique(m[m > 0]).tolist()]


def main(argv: Sequence[str] | None = None) -> None:
    from mixlab.analysis.representations import load_run
    from mixlab.runners.sweep import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mqar_varlen_fig2", help="a sweep preset whose tasks are mqar_varlen")
    parser.add_argument("--windows", default="2,3,4,5", help="comma-separated conv widths")
    parser.add_argument("--rows", type=int, default=3000, help="test rows drawn per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--checkpoint", help="a run saved by `mixlab run --save`: its test accuracy split by m, "
                        "at the first of --windows, on its own test set")
    args = parser.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    if args.checkpoint:
        model, task, meta = load_run(args.checkpoint)
        train = meta["config"]["train"]
        data = task.generate(train["num_test"], seed=train["data_seed"], split="test")
        print(f"{args.checkpoint}: test accuracy by m at W={windows[0]} "
              f"(ceiling {mqar_varlen_window_ceiling(data, windows[0]):.4f})")
        print("| m | queries | accuracy | best possible (1/m) |")
        print("|---|---|---|---|")
        for row in accuracy_by_multiplicity(model, data, windows[0]):
            print(f"| {row['m']} | {row['n']} | {row['acc']:.4f} | {row['best']:.4f} |")
        return
    spec = load_spec(args.preset)
    print(f"| preset | task params | W | ceiling per seed ({args.rows} test rows each) |")
    print("|---|---|---|---|")
    for entry in spec.tasks:
        if entry.task != "mqar_varlen":
            continue
        for point in entry.grid:
            params = {**entry.params, **point}
            task = get_task(entry.task, **params)
            splits = [task.generate(args.rows, seed=seed, split="test") for seed in range(args.seeds)]
            for w in windows:
                values = ", ".join(f"{mqar_varlen_window_ceiling(d, w):.4f}" for d in splits)
                print(f"| {args.preset} | {params} | {w} | {values} |")


if __name__ == "__main__":
    main()
