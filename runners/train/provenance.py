"""Where a record came from: the package versions and the device that produced it."""

from __future__ import annotations

import platform
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
from mixlab import kernels
from mixlab.models import ModelConfig
from mixlab.models.mixers import fla_dqkwg, pattern_classes


def package_versions(model: ModelConfig | None = None) -> dict[str, str]:
    """Versions of what can change a record's numbers; with the ``model`` that produced it, also the lab's stand-in
    for fla's ``chunk_bwd_dqkwg`` where it runs in that model's backward (``runs_dqkwg_stand_in``)."""
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for name in ("triton", "mixlab", "fla-core"):
        try:
            versions[name] = version(name)
        except Exception:  # noqa: BLE001 - a missing optional package is recorded as absent
            versions[name] = "absent"
    if model is not None and runs_dqkwg_stand_in(model):
        versions["fla-core chunk_bwd_dqkwg"] = "mixlab plain torch"
    return versions


def runs_dqkwg_stand_in(model: ModelConfig) -> bool:
    """Whether ``model``'s backward goes through the lab's plain-torch ``chunk_bwd_dqkwg``: fla refused its own
    kernel in this process (the stand-in is registered, models/mixers/fla_dqkwg.py) and one of the model's mixers
    runs the gated delta rule on fla's kernels (every other fla op does without that piece there)."""
    if not fla_dqkwg.registered() or (model.kernel_backend or kernels.utils.env_backend()) == "torch":
        return False
    return any(getattr(cls, "op", None) == "gated_delta_rule" for cls in pattern_classes(model.mixer).values())


def device_info(device: torch.device) -> dict[str, Any]:
    info = {"type": device.type, "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
    else:
        info["name"] = platform.processor() or platform.machine()
    return info
