"""Token representations (docs/representations.md): does one token id look different after different previous tokens?

The Qwen3 placement study's case study: a short conv on Q, K and V mixes each position with the few before it,
so the same token id should carry more of its immediate context in its hidden state than under plain
attention. The tools, for any ``models`` LM:

- ``collect_states``: the residual stream at chosen (row, position) pairs after every sublayer: ``embed``
  (the token embedding), ``<i>.mixer`` (after block i's mixer and its residual add), ``<i>.mlp`` (after its
  MLP).
- ``vary_previous_token``: minimal pairs. Each chosen position of a base context is copied once per candidate
  previous token with only the token before it changed, so the copies differ by that one token.
- ``context_sensitivity``, per layer: mean cosine similarity of two copies of one context
  (``cos_same_context``: 1 when the previous token changes nothing), of two contexts with the same previous
  token and of two with different ones; the share of the states' variance that lies between the copies of one
  context (``prev_share``); the held-out accuracy of a linear probe (scikit-learn logistic regression) that
  reads the previous token from the state in contexts it never saw (``probe_acc``, beside ``chance``).
- generic pieces for any grouping of states (e.g. natural occurrences grouped by previous token):
  ``cosine_within_across``, ``variance_explained``, ``within_group_share``, ``probe_accuracy``, ``pca_2d``.

At ``embed`` every copy of one token id is the same vector: cos_same_context = 1, prev_share = 0 and the probe
is at chance, whatever the model; a reader can check that row first. Everything is seeded; nothing reads
global RNG state. Figures are matplotlib ``Figure`` objects (no pyplot state), which a notebook displays.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd  # seaborn's own dependency
import seaborn as sns
import torch
from matplotlib.figure import Figure
from mixlab import models, tasks
from mixlab.core.fields import PositiveInt, check
from mixlab.models.checkpoint import metadata as checkpoint_metadata
from sklearn.decomposition import PCA
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupShuffleSplit, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn


@dataclasses.dataclass(frozen=True, eq=False)
class TokenStates:
    """Hidden states of N chosen token occurrences at every layer.

    layers: layer names, e.g. ["embed", "1.mixer", "1.mlp"].
    states: float32 [n_layers, N, D].
    token: [N] the token id at each position; prev: [N] the id before it (-1 at a row or document start).
    row, pos: [N] where each occurrence sits in the input batch.
    """

    layers: list[str]
    states: np.ndarray
    token: np.ndarray
    prev: np.ndarray
    row: np.ndarray
    pos: np.ndarray

    def layer(self, name: str) -> np.ndarray:
        """States [N, D] at layer ``name``."""
        if name not in self.layers:
            raise ValueError(f"unknown layer {name!r}; choose from {self.layers}")
        return self.states[self.layers.index(name)]


def load_run(path: str | Path) -> tuple[nn.Module, tasks.Task, dict[str, Any]]:
    """A checkpoint written by ``mixlab run --save``: (model in eval mode on the CPU, the run's task with its
    resolved parameters, the checkpoint's metadata: config, resolved, final metrics, versions, ...)."""
    meta = checkpoint_metadata(path)
    if "config" not in meta or "resolved" not in meta:
        raise ValueError(f"{str(path)!r} is a checkpoint without a run config "
                         "(not written by mixlab run --save)")
    task = tasks.get_task(meta["config"]["task"], **meta["resolved"]["task_params"])
    return models.load(path), task, meta


def find_tokens(input_ids: torch.Tensor, token_ids: Sequence[int], *,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, positions) [N] of every occurrence of ``token_ids`` in ``input_ids`` [B, T] after position 0,
    restricted to ``mask`` [B, T] (bool) when given; row-major order."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    hit = torch.isin(input_ids, torch.as_tensor(list(token_ids), dtype=input_ids.dtype))
    hit[:, 0] = False  # no previous token
    if mask is not None:
        if mask.shape != input_ids.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
        hit &= mask.bool()
    rows, positions = hit.nonzero(as_tuple=True)
    return rows, positions


def vary_previous_token(input_ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                        prev_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Minimal pairs: for each occurrence (rows[n], positions[n]) and each id p of ``prev_ids``, a copy of row
    rows[n] with the token at positions[n] - 1 set to p.

    Returns input_ids [N * P, T] (occurrence-major: the P copies of occurrence n are rows n*P .. n*P+P-1),
    positions [N * P] and base [N * P] (the occurrence n each row comes from).
    """
    if len(rows) != len(positions):
        raise ValueError(f"rows and positions differ in length: {len(rows)} != {len(positions)}")
    if len(positions) and int(positions.min()) < 1:
        raise ValueError(f"positions must be >= 1 (a previous token must exist), got {int(positions.min())}")
    P = len(prev_ids)
    if P < 1:
        raise ValueError("prev_ids must not be empty")
    out = input_ids[rows].repeat_interleave(P, dim=0)  # [N*P, T]
    pos = positions.repeat_interleave(P)  # [N*P]
    prev = torch.as_tensor(list(prev_ids), dtype=input_ids.dtype).repeat(len(rows))  # [N*P]
    out[torch.arange(len(out)), pos - 1] = prev
    return out, pos, torch.arange(len(rows)).repeat_interleave(P)


def _layer_points(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, module, hook kind) of every residual-stream point: the embedding output, the input of each
    block's MLP norm (the stream after the mixer), each block's output."""
    if not hasattr(model, "embed") or not hasattr(model, "blocks"):
        raise ValueError(f"need a models LM (with .embed and .blocks), got {type(model).__name__}")
    points = [("embed", model.embed, "output")]
    for i, block in enumerate(model.blocks, start=1):
        if block.mlp is None:
            points.append((f"{i}.mixer", block, "output"))
        else:
            points.append((f"{i}.mixer", block.mlp_norm, "input"))
            points.append((f"{i}.mlp", block, "output"))
    return points


@torch.no_grad()
def collect_states(model: nn.Module, input_ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, *,
                   doc_ids: torch.Tensor | None = None, batch_size: int = 256) -> TokenStates:
    """Residual-stream states at (rows[n], positions[n]) of ``input_ids`` [B, T] after every sublayer
    (module docstring), running ``model`` (in eval mode, on its device) on the rows that hold them."""
    if len(rows) != len(positions):
        raise ValueError(f"rows and positions differ in length: {len(rows)} != {len(positions)}")
    batch_size = check("batch_size", batch_size, PositiveInt)
    points = _layer_points(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    chunks: list[list[torch.Tensor]] = [[] for _ in points]
    captured: dict[str, torch.Tensor] = {}

    def hook(name: str, kind: str):
        if kind == "input":
            return lambda module, args: captured.__setitem__(name, args[0])
        return lambda module, args, output: captured.__setitem__(name, output)

    handles = [module.register_forward_pre_hook(hook(name, kind)) if kind == "input"
               else module.register_forward_hook(hook(name, kind)) for name, module, kind in points]
    try:
        order = torch.argsort(rows, stable=True)  # run each needed row once per batch of occurrences
        for start in range(0, len(order), batch_size):
            sel = order[start:start + batch_size]
            batch_rows, inverse = torch.unique(rows[sel], return_inverse=True)
            docs = None if doc_ids is None else doc_ids[batch_rows].to(device)
            model(input_ids[batch_rows].to(device), doc_ids=docs)
            at = (inverse.to(device), positions[sel].to(device))
            for chunk, (name, _, _) in zip(chunks, points):
                chunk.append(captured[name][at].float().cpu())  # [n, D]
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if len(rows):
        undo = torch.argsort(order)  # back to the caller's order
        states = torch.stack([torch.cat(chunk)[undo] for chunk in chunks])  # [n_layers, N, D]
    else:
        states = torch.zeros(len(points), 0, model.embed.embedding_dim)
    prev = input_ids[rows, (positions - 1).clamp(min=0)]
    starts = positions == 0
    if doc_ids is not None:
        starts |= doc_ids[rows, (positions - 1).clamp(min=0)] != doc_ids[rows, positions]
    prev = torch.where(starts, -1, prev)
    return TokenStates(layers=[name for name, _, _ in points], states=states.numpy(),
                       token=input_ids[rows, positions].numpy(), prev=prev.numpy(), row=rows.numpy(),
                       pos=positions.numpy())


def cosine_within_across(states: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Mean cosine similarity of the state pairs [N, D] with equal ``labels`` [N] and with different ones
    (every unordered pair once; NaN where there is no such pair)."""
    x = np.asarray(states, dtype=np.float64)
    labels = np.asarray(labels)
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit.T  # [N, N]
    same = labels[:, None] == labels[None, :]
    upper = np.triu(np.ones_like(same), k=1)
    within, across = cos[same & upper], cos[~same & upper]
    return (float(within.mean()) if within.size else float("nan"),
            float(across.mean()) if across.size else float("nan"))


def _sums_of_squares(states: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """(between-group, total) sum of squares of ``states`` [N, D] about their mean; total 0 when every state
    is the same vector up to rounding."""
    x = np.asarray(states, dtype=np.float64)
    groups = np.asarray(groups)
    centred = x - x.mean(0)
    total = float((centred ** 2).sum())
    if total <= 1e-12 * max(float((x ** 2).sum()), 1e-300):
        return 0.0, 0.0
    between = sum(int((groups == g).sum()) * float((centred[groups == g].mean(0) ** 2).sum())
                  for g in np.unique(groups))
    return between, total


def variance_explained(states: np.ndarray, labels: np.ndarray) -> float:
    """Share of the total sum of squares of ``states`` [N, D] that lies between the group means of ``labels``
    [N]: 0 when the label changes nothing (or nothing varies), 1 when it determines the state."""
    between, total = _sums_of_squares(states, labels)
    return between / total if total > 0 else 0.0


def within_group_share(states: np.ndarray, groups: np.ndarray) -> float:
    """Share of the total sum of squares of ``states`` [N, D] that lies within the ``groups`` [N] (1 minus
    ``variance_explained``); 0 when nothing varies."""
    between, total = _sums_of_squares(states, groups)
    return (total - between) / total if total > 0 else 0.0


def probe_accuracy(states: np.ndarray, labels: np.ndarray, *, groups: np.ndarray | None = None, seed: int = 0,
                   test_fraction: float = 0.3) -> tuple[float, float]:
    """(held-out accuracy, chance) of a linear probe reading ``labels`` [N] from ``states`` [N, D].

    Standardised features, multinomial logistic regression (scikit-learn, lbfgs). The held-out share
    ``test_fraction`` is drawn from ``seed``: whole ``groups`` [N] when given (e.g. the base context of each
    minimal pair, so the probe is scored on contexts it never saw), else a stratified split of the rows.
    Chance is the majority class's share of the held-out set.
    """
    x = np.asarray(states, dtype=np.float64)
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2 or counts.min() < 2:
        raise ValueError(f"a probe needs >= 2 classes with >= 2 examples each, got counts {counts.tolist()}")
    if groups is None:
        train, test = train_test_split(np.arange(len(labels)), test_size=test_fraction, random_state=seed,
                                       stratify=labels)
    else:
        if len(np.unique(groups)) < 2:
            raise ValueError("a grouped probe needs at least 2 groups")
        splitter = GroupShuffleSplit(n_splits=1, test_size=test_fraction, random_state=seed)
        train, test = next(splitter.split(x, labels, groups))
    if len(np.unique(labels[train])) < 2:
        raise ValueError("the probe's training split holds a single class")
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    with warnings.catch_warnings():
        # a probe that stops short of convergence still gives a valid (lower) held-out accuracy
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        probe.fit(x[train], labels[train])
    accuracy = float((probe.predict(x[test]) == labels[test]).mean())
    chance = float(np.unique(labels[test], return_counts=True)[1].max() / len(test))
    return accuracy, chance


def pca_2d(states: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(coordinates [N, 2] on the first two principal components, their explained-variance ratios [2])."""
    pca = PCA(n_components=2, random_state=seed)
    coords = pca.fit_transform(np.asarray(states, dtype=np.float64))
    return coords, pca.explained_variance_ratio_


def _mean_cosine(cos: np.ndarray, pairs: np.ndarray) -> float:
    values = cos[pairs]
    return float(values.mean()) if values.size else float("nan")


def context_sensitivity(token_states: TokenStates, base: np.ndarray, *,
                        seed: int = 0) -> list[dict[str, Any]]:
    """Per layer, for minimal pairs (``vary_previous_token``; ``base`` [N] = the context each state comes
    from, its previous token in ``token_states.prev``), one row:

    - cos_same_context: mean cosine of two states of one context that differ only in the previous token
      (1: the previous token changes nothing);
    - cos_same_prev: mean cosine of two different contexts with the same previous token;
    - cos_different: different contexts and different previous tokens;
    - prev_share: the share of the states' variance that lies between the copies of one context,
      ``within_group_share(states, base)`` (0: insensitive to the previous token);
    - probe_acc, chance: a linear probe for the previous token, scored on held-out contexts.
    """
    base = np.asarray(base)
    labels = token_states.prev
    if len(base) != len(labels):
        raise ValueError(f"{len(base)} base labels for {len(labels)} states")
    same_context = base[:, None] == base[None, :]
    same_prev = labels[:, None] == labels[None, :]
    upper = np.triu(np.ones(same_context.shape, dtype=bool), k=1)  # every unordered pair once
    rows = []
    for name, states in zip(token_states.layers, token_states.states):
        x = np.asarray(states, dtype=np.float64)
        unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        cos = unit @ unit.T  # [N, N]
        accuracy, chance = probe_accuracy(x, labels, groups=base, seed=seed)
        rows.append({
            "layer": name,
            "cos_same_context": _mean_cosine(cos, upper & same_context & ~same_prev),
            "cos_same_prev": _mean_cosine(cos, upper & ~same_context & same_prev),
            "cos_different": _mean_cosine(cos, upper & ~same_context & ~same_prev),
            "prev_share": within_group_share(x, base),
            "probe_acc": accuracy,
            "chance": chance,
        })
    return rows


# --- figures (matplotlib Figure objects, no pyplot: no global figure state; a notebook displays them)


METRIC_LABELS = {
    "cos_same_context": "cosine of two copies of one context",
    "prev_share": "share of variance due to the previous token",
    "probe_acc": "previous-token probe accuracy (held-out contexts)",
    "cos_same_prev": "cosine, other context, same previous token",
    "cos_different": "cosine, other context, other previous token",
}
COSINES = {"cos_same_context": "same context", "cos_same_prev": "other context, same prev",
           "cos_different": "other context, other prev"}


def plot_sensitivity(rows: Sequence[Mapping[str, Any]],
                     metrics: Sequence[str] = ("cos_same_context", "prev_share", "probe_acc")) -> Figure:
    """One panel per metric against the layer, one line per model; rows need ``model`` and ``layer`` keys plus
    the metrics (``context_sensitivity`` rows with a model name added). The probe panel marks chance."""
    frame = pd.DataFrame(list(rows))
    if frame.empty:
        raise ValueError("no rows to plot")
    fig = Figure(figsize=(4.6 * len(metrics), 3.8))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        sns.lineplot(frame, x="layer", y=metric, hue="model", marker="o", sort=False, ax=ax)
        if metric == "probe_acc" and "chance" in frame:
            ax.axhline(float(frame["chance"].max()), color="grey", linestyle="--", linewidth=1,
                       label="chance")
        ax.set(ylabel=METRIC_LABELS.get(metric, metric), ylim=(-0.03, 1.03))
        ax.legend(fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def plot_cosines(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Bars of the three mean cosines per layer (``COSINES``), one panel per model (``plot_sensitivity``'s
    rows)."""
    frame = pd.DataFrame(list(rows))
    if frame.empty:
        raise ValueError("no rows to plot")
    long = frame.melt(id_vars=["model", "layer"], value_vars=list(COSINES), var_name="pairs",
                      value_name="mean cosine")
    long["pairs"] = long["pairs"].map(COSINES)
    model_names = list(dict.fromkeys(frame["model"]))
    fig = Figure(figsize=(4.2 * len(model_names), 3.8))
    axes = fig.subplots(1, len(model_names), squeeze=False, sharey=True)[0]
    for ax, name in zip(axes, model_names):
        sns.barplot(long[long["model"] == name], x="layer", y="mean cosine", hue="pairs", ax=ax,
                    legend=ax is axes[-1])
        ax.set_title(name)
    sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1.01, 1), frameon=False, title="pairs of states")
    fig.tight_layout()
    return fig


def plot_pca(panels: Mapping[str, tuple[np.ndarray, np.ndarray]], *, legend_title: str = "",
             title: str = "") -> Figure:
    """Scatter of 2D coordinates coloured by label, one panel per entry of ``panels`` (name -> (coords [N, 2],
    labels [N]), e.g. ``pca_2d`` of one layer per model)."""
    if not panels:
        raise ValueError("no panels to plot")
    fig = Figure(figsize=(4.2 * len(panels) + 1.5, 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, (coords, labels)) in zip(axes, panels.items()):
        hue = [str(v) for v in labels]
        sns.scatterplot(x=coords[:, 0], y=coords[:, 1], hue=hue, hue_order=sorted(set(hue), key=_natural),
                        s=14, linewidth=0, palette="tab10", ax=ax, legend=ax is axes[-1])
        ax.set(title=name, xlabel="PC 1", ylabel="PC 2")
    if axes[-1].get_legend() is not None:
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1.01, 1), frameon=False, title=legend_title)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _natural(text: str) -> tuple[int, str]:
    """Sort key: numbers by value, then text."""
    return (int(text), "") if text.lstrip("-").isdigit() else (1 << 62, text)
