"""Accuracy of a trained model on packed associative retrieval by query kind and by the query's distance from its
document start (docs/packed.md).

Where does a leaky mixer fail? An absent-key query (answer NONE) early in a document sits close to the previous
document's copy of its key, so a leak might show there; a query late in a long document has more pairs, its own
and the other documents', to pick among. Reading accuracy by distance tells these apart (at CPU size the leaky
Hyena's deficit grew with distance: reproductions/packed/NOTES.md).

A saved run is scored on its own test set: ``runners.train.run.load_saved_run`` loads the model and regenerates that
set, then ``accuracy_by_distance(predictions(model, test), test, edges)``.
"""

from __future__ import annotations

import numpy as np
import torch
from mixlab.tasks.base import IGNORE, TaskData
from mixlab.tasks.packed.associative_retrieval import NONE
from torch import nn

KINDS = ("present", "absent")


def query_distances(data: TaskData) -> np.ndarray:
    """[N, T] distance of every token from its document's first token (BOS)."""
    ids = data.doc_ids.numpy()
    n, t = ids.shape
    new_doc = np.ones((n, t), dtype=bool)
    new_doc[:, 1:] = ids[:, 1:] != ids[:, :-1]
    positions = np.broadcast_to(np.arange(t), (n, t))
    starts = np.maximum.accumulate(np.where(new_doc, positions, 0), axis=1)
    return positions - starts


@torch.no_grad()
def predictions(model: nn.Module, data: TaskData, batch_size: int = 64) -> np.ndarray:
    """[N, T] argmax of ``model(inputs, doc_ids=...)`` on every row of ``data`` (model on its own device)."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(data), batch_size):
        logits = model(data.inputs[i:i + batch_size].to(device), doc_ids=data.doc_ids[i:i + batch_size].to(device))
        out.append(logits.argmax(-1).cpu().numpy())
    return np.concatenate(out)


def accuracy_by_distance(predicted: np.ndarray, data: TaskData, edges: tuple[int, ...]) -> dict[str, list]:
    """Accuracy of ``predicted`` [N, T] at the scored queries of ``data``, per kind (present: a value is the
    answer; absent: NONE) and distance bin [edges[i], edges[i+1]) (the last bin open-ended).

    Returns {"bins": ["a-b", ...], "<kind>": [accuracy or nan per bin], "n_<kind>": [count per bin]}.
    """
    if list(edges) != sorted(set(edges)) or not edges or edges[0] < 0:
        raise ValueError(f"edges must be increasing non-negative distances, got {edges!r}")
    targets = data.targets.numpy()
    scored = targets != IGNORE
    distance = query_distances(data)
    bin_of = np.searchsorted(np.asarray(edges), distance, side="right") - 1  # -1 below the first edge
    hit = predicted == targets
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(edges[:-1], edges[1:])] + [f"{edges[-1]}+"]
    out: dict[str, list] = {"bins": labels}
    for kind, mask in zip(KINDS, (scored & (targets != NONE), targets == NONE)):
        counts = np.bincount(bin_of[mask & (bin_of >= 0)], minlength=len(edges))
        hits = np.bincount(bin_of[mask & hit & (bin_of >= 0)], minlength=len(edges))
        out[kind] = [h / c if c else float("nan") for h, c in zip(hits.tolist(), counts.tolist())]
        out[f"n_{kind}"] = counts.tolist()
    return out

