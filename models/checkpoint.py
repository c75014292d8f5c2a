"""Checkpoints: a model's weights with its whole ModelConfig, so `load` rebuilds it without other files.

A checkpoint is one ``torch.save`` file holding only plain types and tensors (read back with
``weights_only=True``, never arbitrary pickles)::

    {"format": "mixlab-checkpoint", "format_version": 1,
     "model_config": ModelConfig.to_dict(),      # every field, enough to rebuild the model
     "state_dict": {name: tensor},               # on the CPU
     "metadata": {...}}                          # JSON-like: run config, metrics, versions, ...

``runners.train.run.train_run(..., save=True)`` (``mixlab run --save``) writes one beside the run's JSON record,
holding the weights of the evaluation the record's ``final`` metrics come from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from mixlab.core.atomic import atomic_file
from mixlab.models.config import ModelConfig
from mixlab.models.lm import build_model
from torch import nn

FORMAT = "mixlab-checkpoint"
FORMAT_VERSION = 1


def save(model: nn.Module, path: str | Path, *, metadata: Mapping[str, Any] | None = None,
         state_dict: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` (a ``models.build_model`` model) and its config to ``path``, atomically
    (``core.atomic.atomic_file``: a reader never sees half a checkpoint; the umask sets its permissions).

    ``state_dict`` replaces the model's current weights (e.g. a snapshot of an earlier step); ``metadata``
    must be JSON-serialisable (tuples come back as lists). Returns the path.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise ValueError(f"save needs a model built by models.build_model, got {type(model).__name__}")
    weights = model.state_dict() if state_dict is None else state_dict
    try:
        meta = json.loads(json.dumps(dict(metadata or {})))
    except TypeError as exc:
        raise ValueError(f"checkpoint metadata is not JSON-serialisable: {exc}") from exc
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_config": config.to_dict(),
        "state_dict": {name: t.detach().to("cpu", copy=True) for name, t in weights.items()},
        "metadata": meta,
    }
    path = Path(path)
    # to a file object, not a path: a failed write is then an OSError naming the checkpoint
    with atomic_file(path) as f:
        torch.save(payload, f)
    return path


def read(path: str | Path) -> dict[str, Any]:
    """The checked contents of a checkpoint (keys of the module docstring); ValueError if ``path`` is not a
    mixlab checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint file {str(path)!r}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported as "not a checkpoint"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{str(path)!r} is not a mixlab checkpoint ({reason})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a mixlab checkpoint (no format {FORMAT!r} marker)")
    if payload.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{str(path)!r} has checkpoint format_version {payload.get('format_version')!r}; "
                         f"this mixlab reads {FORMAT_VERSION}")
    return payload


def metadata(path: str | Path) -> dict[str, Any]:
    """The metadata and model config of a checkpoint, without building the model."""
    payload = read(path)
    return {"model_config": payload["model_config"], **payload["metadata"]}


def load(path: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """The model saved at ``path``, on ``device`` and in eval mode; it gives the same logits as the model
    that was saved. ValueError if ``path`` is not a mixlab checkpoint or its weights do not fit its config."""
    payload = read(path)
    config = ModelConfig.from_dict(payload["model_config"])
    # build_model draws a throwaway random init; fork so the caller's RNG state is left alone
    with torch.random.fork_rng(devices=[]):
        model = build_model(config)
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{str(path)!r}: weights do not fit its model config "
                         f"({str(exc).strip().splitlines()[0]})") from exc
    return model.to(device).eval()
