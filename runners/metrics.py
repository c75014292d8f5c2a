"""Evaluation metrics over scored positions (targets != -100)."""

from __future__ import annotations

import torch

from tasks import IGNORE


def batch_counts(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Loss sum, correct count and per-class confusion counts of one batch.

    logits [B, T, V], targets [B, T] (-100 = not scored). Returns scalars ``loss_sum``, ``n``, ``correct`` and
    per-class ``tp``, ``fp``, ``fn`` [V] (float64, on the logits' device).
    """
    vocab = logits.shape[-1]
    mask = targets != IGNORE
    scored_logits = logits[mask].float()  # [S, V]
    scored_targets = targets[mask]  # [S]
    loss_sum = torch.nn.functional.cross_entropy(scored_logits, scored_targets, reduction="sum")
    pred = scored_logits.argmax(dim=-1)
    hit = pred == scored_targets
    tp = torch.bincount(scored_targets[hit], minlength=vocab).double()
    fn = torch.bincount(scored_targets[~hit], minlength=vocab).double()
    fp = torch.bincount(pred[~hit], minlength=vocab).double()
    return {
        "loss_sum": loss_sum.double(),
        "n": mask.sum().double(),
        "correct": hit.sum().double(),
        "tp": tp,
        "fp": fp,
        "fn": fn,
    }


def macro_accuracy(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """Macro-averaged multiclass accuracy with torchmetrics' ``MulticlassAccuracy`` defaults (as mad-lab reports it).

    Per class recall tp / (tp + fn) (0 where the class never occurs as a target), averaged over the classes that
    occur as a target or a prediction (tp + fp + fn > 0): a class that is only ever predicted counts as 0.
    """
    support = tp + fn
    recall = torch.where(support > 0, tp / support.clamp(min=1), torch.zeros_like(tp))
    seen = (tp + fp + fn) > 0
    return recall[seen].mean() if bool(seen.any()) else torch.zeros((), dtype=tp.dtype, device=tp.device)
