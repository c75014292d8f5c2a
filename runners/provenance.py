"""Where a record came from: the package versions and the device that produced it."""

from __future__ import annotations

import platform
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
from mixlab.models.mixers import fla_dqkwg


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for name in ("triton", "mixlab", "fla-core"):
        try:
            versions[name] = version(name)
        except Exception:  # noqa: BLE001 - a missing optional package is recorded as absent
            versions[name] = "absent"
    if fla_dqkwg.registered():  # fla refuses its kernel on this GPU (models/mixers/fla_dqkwg.py)
        versions["fla-core chunk_bwd_dqkwg"] = "mixlab plain torch"
    return versions


def device_info(device: torch.device) -> dict[str, Any]:
    info = {"type": device.type, "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
    else:
        info["name"] = platform.processor() or platform.machine()
    return info
