"""Accuracy ceilings that a task's data sets for a model class, computed from the data before any training.

Variable-length-key MQAR (SPEC 3.2, ``tasks.mqar_varlen``) read by ONE attention layer with a causal width-W conv
on its keys: at the separator of a pair's second occurrence the layer must output the pair's value, and the only
position whose value vector holds that token is the value's position in the context (a causal conv there sees
nothing later). So the query must find that position by its key vector, which sees the W tokens ending there:
the value, the separator (it encodes the key's length) and at most the last W - 2 key tokens. Two pairs of a row
whose keys have the same length and the same last W - 2 tokens are one key to the layer; values are drawn
independently of keys, so among m such pairs any rule is right with probability 1 / m on average. The ceiling
is the mean of 1 / m over every scored query. A conv of width >= longest key + 2, or a second layer, lifts it.

    python -m analysis.ceilings --preset mqar_varlen_fig2 --windows 2,3,4,5
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence

import numpy as np

from tasks import get_task
from tasks.base import IGNORE, Role, TaskData


def mqar_varlen_window_ceiling(data: TaskData, window: int) -> float:
    """Best expected query accuracy of one attention layer whose keys see ``window`` tokens (module docstring).

    data: a split of ``mqar_varlen`` (inputs, targets, roles [N, T]); window: the conv width W >= 1 (W = 1, no
    conv, is given the separator as well, which only raises the ceiling). Returns a float in (0, 1].
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    inputs, targets, roles = (t.numpy() for t in (data.inputs, data.targets, data.roles))
    visible = max(window - 2, 0)  # key tokens in the window beside the value and the separator
    total, n_queries = 0.0, 0
    for row_in, row_tgt, row_role in zip(inputs, targets, roles, strict=True):
        seps = np.flatnonzero(row_role == Role.SEPARATOR)
        signatures = {}  # separator position -> (key length, its visible key tokens)
        for s in seps:
            length = int(row_in[s])  # SEP_L has id L
            signatures[s] = (length, tuple(row_in[s - min(length, visible) : s].tolist()))
        context = Counter(signatures[s] for s in seps if row_tgt[s] == IGNORE)
        for s in seps[row_tgt[seps] != IGNORE]:
            total += 1.0 / context[signatures[s]]
            n_queries += 1
    if n_queries == 0:
        raise ValueError("the data has no scored query")
    return total / n_queries


def main(argv: Sequence[str] | None = None) -> None:
    from runners.sweep import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mqar_varlen_fig2", help="a sweep preset whose tasks are mqar_varlen")
    parser.add_argument("--windows", default="2,3,4,5", help="comma-separated conv widths")
    parser.add_argument("--rows", type=int, default=3000, help="test rows drawn per seed")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
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
