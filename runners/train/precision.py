"""Where a run trains and in which precision: the device a config names, and the autocast rule.

``precision="auto"`` trains under bf16 autocast on CUDA and in fp32 on the CPU; ``"bf16"`` is autocast anywhere
(on the CPU too, which the stacked engine's bitwise tests use), ``"fp32"`` never.
"""

from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    """The device of a TrainConfig's ``device``: ``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(name)


def uses_bf16(precision: str, device: torch.device) -> bool:
    """Whether a run of this precision (``auto``, ``fp32`` or ``bf16``) on this device runs under bf16 autocast."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def bf16_autocast(device: torch.device, enabled: bool, cache: bool | None = None) -> torch.autocast:
    """bf16 autocast on the device when enabled (else a no-op context); ``cache`` False keeps no cast weights
    (under CUDA graph capture they would outlive the graph's memory), None is torch's default."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled, cache_enabled=cache)
