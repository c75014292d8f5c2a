"""Evaluation on the test set, batch by batch, into ``runners.train.metrics.EvalSums``: one run's model here
(``evaluate``), a stack's in ``runners.train.engine`` over the same ``eval_batches``.

Sparse tasks get logits at the scored positions only, as in training: same counts, a fraction of the memory.
"""

from __future__ import annotations

import torch
from mixlab import tasks
from mixlab.runners.train.metrics import EvalSums, scored_view
from mixlab.runners.train.precision import bf16_autocast


def eval_batches(num_test: int, batch_size: int) -> list[slice]:
    """The rows of each test batch, in order; the last may be short."""
    return [slice(start, start + batch_size) for start in range(0, num_test, batch_size)]


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: tasks.TaskData, batch_size: int, device: torch.device,
             autocast: bool, task: tasks.Task | None = None) -> dict[str, float]:
    """Test loss, perplexity, micro accuracy and macro accuracy (per batch, averaged over batches, as mad-lab),
    plus ``acc_<group>`` and ``n_<group>`` for each of the task's score groups (e.g. present / absent queries)."""
    model.eval()
    sums = EvalSums(task)
    positions, all_targets = scored_view(data.targets)  # [N, S] each, or None and [N, T]
    for rows in eval_batches(len(data), batch_size):
        inputs, targets = data.inputs[rows].to(device), all_targets[rows].to(device)
        doc_ids = None if data.doc_ids is None else data.doc_ids[rows].to(device)
        at = None if positions is None else positions[rows].to(device)
        with bf16_autocast(device, autocast):
            logits = model(inputs, doc_ids=doc_ids, positions=at)  # [B, T or S, V]
        sums.add(logits, targets)
    model.train()
    return sums.metrics()
