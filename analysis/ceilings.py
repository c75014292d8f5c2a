"""Accuracy ceilings that a task's data sets for a model class, and the floor any model reaches by answering one
token, computed from the data before any training.

Variable-length-key MQAR (docs/tasks.md, ``tasks.mqar_varlen``) read by ONE attention layer with a causal width-W conv
on its keys: at the separator of a pair's second occurrence the layer must output the pair's value, and the only
position whose value vector holds that token is the value's position in the context (a causal conv there sees
nothing later). So the query must find that position by its key vector, which sees the W tokens ending there:
the value, the separator (it encodes the key's length) and at most the last W - 2 key tokens. Two pairs of a row
whose keys have the same length and the same last W - 2 tokens are one key to the layer; values are drawn
independently of keys, so among m such pairs any rule is right with probability 1 / m on average. The ceiling
is the mean of 1 / m over every scored query. A conv of width >= longest key + 2, or a second layer, lifts it.

MAD memorization (docs/mad.md, ``tasks.mad.memorization``): the value of a key never appears in any input, so the
only source of it is a training row that holds the key. A test position whose key no training row holds can only
be guessed, among the values not seen as training targets (one chance in their number at best). The ceiling is
the share of scored test positions whose key some training row holds (``memorization_ceiling``); with the sweep's
256 training rows it falls below 1 from vocabulary 2,048 on (``memorization_ceilings``).

Chance (``chance_accuracy``): the micro accuracy of the best constant answer, the share of the commonest target
among a test split's scored positions. On MQAR with 4,096 values it is about 0.001; on packed associative
retrieval, where half the queries answer NONE, it is 0.5: a model that answers NONE everywhere scores it.
``analysis.claims`` calls a run whose accuracy sits near it untrained.

The tables take plain task parameters; ``mixlab ceilings`` (runners/cli/ceilings.py) reads them from a sweep
preset::

    mixlab ceilings --preset mqar_varlen_fig2 --windows 2,3,4,5   # the ceiling of each width
    mixlab ceilings --checkpoint runs/<run>.pt --windows 4       # a trained run's accuracy by m
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mixlab.core.fields import PositiveInt, check
from mixlab.tasks import get_task
from mixlab.tasks.base import IGNORE, Role, TaskData
from mixlab.tasks.mad import mad_sweep_settings
from torch import nn

MEMORIZATION = "mad/memorization"


def query_multiplicity(data: TaskData, window: int) -> torch.Tensor:
    """m [N, T] (int64): at each scored query separator of ``mqar_varlen`` data, how many context pairs of its row
    (its own included) look like its pair through a width-``window`` key conv at the value (module docstring);
    0 at every other position. W = 1 (no conv) is given the separator as well, which only lowers m."""
    window = check("window", window, PositiveInt)
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


def ceiling_table(label: str, settings: Sequence[Mapping[str, Any]], windows: Sequence[int], rows: int,
                  seeds: int) -> str:
    """A markdown table of ``mqar_varlen_window_ceiling``: a row per (``mqar_varlen`` parameters of ``settings``,
    window) with the ceiling on ``rows`` test rows of each data seed 0..seeds-1; ``label`` (e.g. the sweep preset
    the settings come from) fills the first column."""
    lines = [f"| preset | task params | W | ceiling per seed ({rows} test rows each) |", "|---|---|---|---|"]
    for params in settings:
        task = get_task("mqar_varlen", **params)
        splits = [task.generate(rows, seed=seed, split="test") for seed in range(seeds)]
        for w in windows:
            values = ", ".join(f"{mqar_varlen_window_ceiling(d, w):.4f}" for d in splits)
            lines.append(f"| {label} | {dict(params)} | {w} | {values} |")
    return "\n".join(lines)


def multiplicity_table(checkpoint: str | Path, window: int) -> str:
    """A run saved by ``mixlab run --save``: its test accuracy split by ``query_multiplicity`` at ``window``, on
    its own test set, as a markdown table under a line giving the checkpoint and its ceiling."""
    # imported here: representations imports seaborn and scikit-learn, which only this table needs
    from mixlab.analysis.representations import load_run

    model, task, meta = load_run(checkpoint)
    train = meta["config"]["train"]
    data = task.generate(train["num_test"], seed=train["data_seed"], split="test")
    lines = [f"{checkpoint}: test accuracy by m at W={window} "
             f"(ceiling {mqar_varlen_window_ceiling(data, window):.4f})",
             "| m | queries | accuracy | best possible (1/m) |", "|---|---|---|---|"]
    lines += [f"| {row['m']} | {row['n']} | {row['acc']:.4f} | {row['best']:.4f} |"
              for row in accuracy_by_multiplicity(model, data, window)]
    return "\n".join(lines)


def chance_accuracy(task: str, params: Mapping[str, Any], num_test: int, seed: int) -> float:
    """The micro accuracy of the best constant answer on the test split of ``task`` with ``params`` (``num_test``
    rows of data seed ``seed``, as a run's evaluation draws them): the commonest scored target's share."""
    return _chance(task, json.dumps(dict(params), sort_keys=True), num_test, seed)


@functools.lru_cache(maxsize=256)
def _chance(task: str, params: str, num_test: int, seed: int) -> float:
    targets = get_task(task, **json.loads(params)).generate(num_test, seed=seed, split="test").targets
    scored = targets[targets != IGNORE]
    if scored.numel() == 0:
        raise ValueError(f"the test split of {task} has no scored position")
    return int(torch.bincount(scored).max()) / scored.numel()


def memorization_ceiling(train: TaskData, test: TaskData) -> float:
    """MAD memorization: the share of the test split's scored positions whose key (the input just before) occurs
    among the training split's keys (module docstring). Returns a float in [0, 1]."""
    seen = torch.unique(train.inputs[train.roles == Role.KEY])
    scored = test.targets[:, 1:] != IGNORE  # [N, T-1]: a target at position t + 1 answers the key at t
    keys = test.inputs[:, :-1][scored]
    if keys.numel() == 0:
        raise ValueError("the test split has no scored position")
    return float(torch.isin(keys, seen).double().mean())


def memorization_ceilings(seeds: Sequence[int] = (0, 1, 2)) -> list[dict[str, Any]]:
    """``memorization_ceiling`` of every memorization setting of the MAD sweep (its training and test rows) for
    each data seed: one row per (setting, seed) with its vocabulary size and ceiling."""
    rows = []
    for setting in (s for s in mad_sweep_settings() if s.task == MEMORIZATION):
        task = get_task(setting.task, **setting.params)
        for seed in seeds:
            train = task.generate(setting.num_train, seed=seed, split="train")
            test = task.generate(setting.num_test, seed=seed, split="test")
            rows.append({"setting": setting.label, "vocab_size": setting.params["vocab_size"], "seed": seed,
                         "ceiling": memorization_ceiling(train, test)})
    return rows
