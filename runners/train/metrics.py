"""Evaluation metrics over scored positions (targets != -100), computed on the device without host syncs.

A sync per test batch is cheap alone, but several sweep workers share one GPU: each sync then waits for the
other processes' queued work, and evaluations then took most of a run's wall time.
Counts stay on the device; `EvalSums.metrics` reads them once per evaluation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from mixlab.tasks import IGNORE

if TYPE_CHECKING:
    from mixlab.tasks import Task


def batch_counts(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Loss sum, correct count and per-class confusion counts of one batch.

    logits [B, T, V], targets [B, T] (-100 = not scored). Returns scalars ``loss_sum``, ``n``, ``correct`` and
    per-class ``tp``, ``fp``, ``fn`` [V] (float64, on the logits' device). No host sync: unscored positions
    enter every count with weight 0 instead of being selected out (a data-dependent shape).
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab).float()  # [B*T, V]
    target = targets.reshape(-1)  # [B*T]
    mask = target != IGNORE
    # summed in float64: exact for these float32 terms in practice, so the sum does not depend on how many
    # unscored (zero) terms sit between them, e.g. a stack's wider padding (runners.train.engine)
    loss_sum = F.cross_entropy(flat, target, ignore_index=IGNORE, reduction="none").double().sum()
    pred = flat.argmax(dim=-1)  # [B*T]
    hit = (pred == target) & mask
    miss = (mask & ~hit).double()
    safe_target = torch.where(mask, target, torch.zeros_like(target))  # any class: its weight is 0
    zeros = torch.zeros(vocab, dtype=torch.float64, device=logits.device)
    return {
        "loss_sum": loss_sum,
        "n": mask.sum().double(),
        "correct": hit.sum().double(),
        "tp": zeros.scatter_add(0, safe_target, hit.double()),
        "fp": zeros.scatter_add(0, pred, miss),
        "fn": zeros.scatter_add(0, safe_target, miss),
    }


def training_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (fp32) over the scored positions of logits [B, T, V] and targets [B, T]: the loss a run
    trains on, alone or in a stack (one call a run there too: a batched mean would sum in another order)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def macro_accuracy(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """Macro-averaged multiclass accuracy with torchmetrics' ``MulticlassAccuracy`` defaults (as mad-lab reports it).

    Per class recall tp / (tp + fn) (0 where the class never occurs as a target), averaged over the classes that
    occur as a target or a prediction (tp + fp + fn > 0): a class that is only ever predicted counts as 0.
    Returns a 0-dim tensor (0 when no class occurs), without a host sync.
    """
    support = tp + fn
    recall = torch.where(support > 0, tp / support.clamp(min=1), torch.zeros_like(tp))
    seen = (tp + fp + fn) > 0
    count = seen.sum()
    return torch.where(count > 0, (recall * seen).sum() / count.clamp(min=1), torch.zeros_like(recall[0]))


class EvalSums:
    """One run's evaluation, accumulated test batch by test batch on the device; ``metrics`` reads it once.

    Metrics: test loss (mean over scored positions), micro accuracy, and ``acc_<group>`` / ``n_<group>`` for
    each of the task's score groups (e.g. present / absent queries); macro accuracy and perplexity as mad-lab
    logs them (PyTorch Lightning's epoch value of a per-batch metric): each batch's value (the macro accuracy of
    its scored positions; exp of its mean loss, 1 for a batch with nothing scored), averaged over the batches
    weighted by their rows, so a short last batch counts for its rows only.
    """

    def __init__(self, task: Task | None = None) -> None:
        self.task = task
        self.parts: list[torch.Tensor] = []  # per batch [4 + 2 * groups] float64
        self.rows: list[int] = []  # rows per batch
        self.groups: list[str] = []

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """logits [B, T, V], targets [B, T] of one test batch."""
        counts = batch_counts(logits, targets)
        part = [counts["loss_sum"], counts["n"], counts["correct"],
                macro_accuracy(counts["tp"], counts["fp"], counts["fn"]).double()]
        if self.task is not None:
            hit = logits.argmax(dim=-1) == targets  # [B, T]
            groups = self.task.score_groups(targets)
            self.groups = list(groups)
            for mask in groups.values():
                part += [(hit & mask).sum().double(), mask.sum().double()]
        self.parts.append(torch.stack(part))
        self.rows.append(targets.shape[0])

    def metrics(self) -> dict[str, float]:
        rows = torch.stack(self.parts).tolist() if self.parts else []  # the one host sync
        loss_sum = n = correct = 0.0
        for row in rows:  # summed in batch order in float64, as the per-batch floats were before
            loss_sum += row[0]
            n += row[1]
            correct += row[2]
        loss = loss_sum / max(n, 1.0)
        weights = self.rows if rows else [1]
        batch_ppl = [math.exp(min(row[0] / max(row[1], 1.0), 700.0)) for row in rows]
        out = {"test_loss": loss, "test_ppl": float(np.average(batch_ppl or [1.0], weights=weights)),
               "acc_micro": correct / max(n, 1.0),
               "acc_macro": float(np.average([row[3] for row in rows] or [0.0], weights=weights)),
               "n_scored": int(n)}
        for g, name in enumerate(self.groups):
            hits = sum(row[4 + 2 * g] for row in rows)
            count = sum(row[5 + 2 * g] for row in rows)
            out[f"acc_{name}"] = hits / count if count else float("nan")
            out[f"n_{name}"] = int(count)
        return out


# The head and the loss run only at scored positions when at most this share of a row is scored: the loss is
# the same mean over the same positions, and a row of 256 tokens with 16 answers (MQAR) skips 15/16 of the
# [B, T, V] logits, the largest tensor of such a step.
SPARSE_HEAD_MAX_SHARE = 0.25


def sparse_width(targets: torch.Tensor) -> int | None:
    """The most scored positions of any row of targets [N, T], or None when a row scores more than
    ``SPARSE_HEAD_MAX_SHARE`` of T (or none is scored): then the full head costs about as much."""
    most = int((targets != IGNORE).sum(dim=1).max()) if targets.numel() else 0
    return most if 0 < most <= SPARSE_HEAD_MAX_SHARE * targets.shape[1] else None


def scored_positions(targets: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's scored positions, in order, then unscored ones: positions [N, width] (long) and the targets
    there [N, width]. width >= every row's scored count, so every scored position is kept; the extra
    positions' targets are -100, which the loss ignores."""
    unscored = (targets == IGNORE).to(torch.int8)  # [N, T]: 0 sorts first, stable keeps the order
    positions = torch.sort(unscored, dim=1, stable=True).indices[:, :width]
    return positions, targets.gather(1, positions)


def scored_view(targets: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What a model is asked for on targets [N, T]: (None, targets) for a dense task, else (positions, targets)
    [N, S] at each row's scored positions (``sparse_width``, ``scored_positions``)."""
    width = sparse_width(targets)
    return (None, targets) if width is None else scored_positions(targets, width)
